"""Why a relay term was lost: the reason read from the lease row, a clock jump outranking it,
and a refused renewal's read-back (pure logic; the database is replaced by scripted answers)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from outboxkit.relay import lease_loss
from outboxkit.relay.lease import LeaseStore, LeaseTerm
from outboxkit.relay.lease_loss import LeaseLoss, blame_jump, why_check_failed

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 4, 0, 41, 29, tzinfo=UTC)


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _term(trusted_for: float, shard: int = 0, wall: Callable[[], float] | None = None) -> LeaseTerm:
    term = LeaseTerm(
        "g", shard, "A", 7, 15.0, 0.0, clock=FakeClock(100.0), wall=wall or FakeClock(0)
    )
    term.trusted_until = 100.0 + trusted_for
    return term


@pytest.mark.parametrize(
    ("row", "trusted_for", "cause", "reason"),
    [
        (None, 5.0, LeaseLoss.UNKNOWN, "the lease row is gone"),
        (
            (8, "B", NOW + timedelta(seconds=9), NOW),
            5.0,
            LeaseLoss.TAKEN_OVER,
            "taken over (token 8 now, held by B)",
        ),
        (
            (9, None, NOW, NOW),
            5.0,
            LeaseLoss.TAKEN_OVER,
            "taken over (token 9 now, since released)",
        ),
        (
            (6, "A", NOW + timedelta(seconds=9), NOW),
            5.0,
            LeaseLoss.UNKNOWN,
            "the lease row shows an older token (6) than this term's: the database lost commits"
            " (an asynchronous failover or a restore)",
        ),
        ((7, None, NOW, NOW), 5.0, LeaseLoss.RELEASED, "released"),
        (
            (7, "Z", NOW + timedelta(seconds=9), NOW),
            5.0,
            LeaseLoss.UNKNOWN,
            "this term's token is held by Z (changed by hand)",
        ),
        (
            (7, "A", NOW - timedelta(seconds=1.5), NOW),
            6.2,
            LeaseLoss.CLOCK_JUMP,
            "expired by the database clock 1.5s ago while this process still trusted it for"
            " 6.2s (the clocks disagree: this host was paused, the database host's clock jumped"
            " or was stepped, or a database failover lost the latest renewals)",
        ),
        (
            (7, "A", NOW - timedelta(seconds=2), NOW),
            -1.0,
            LeaseLoss.EXPIRED,
            "expired by the database clock 2.0s ago (renewals did not succeed)",
        ),
        (
            (7, "A", NOW + timedelta(seconds=3), NOW),
            5.0,
            LeaseLoss.UNKNOWN,
            "refused, but the lease row is ours and unexpired now",
        ),
    ],
)
def test_the_reason_names_what_the_lease_row_shows(
    row: tuple[object, ...] | None, trusted_for: float, cause: LeaseLoss, reason: str
) -> None:
    assert why_check_failed(_term(trusted_for), row) == (cause, reason)


@pytest.mark.parametrize(
    ("row", "cause"),
    [
        # What a pause leads to: a standby took over meanwhile, or nobody did yet.
        ((8, "B", NOW + timedelta(seconds=9), NOW), LeaseLoss.CLOCK_JUMP),
        ((7, "A", NOW - timedelta(seconds=20), NOW), LeaseLoss.CLOCK_JUMP),
        # What a pause does not cause keeps its own reason: a release, a lost commit.
        ((7, None, NOW, NOW), LeaseLoss.RELEASED),
        ((6, "A", NOW + timedelta(seconds=9), NOW), LeaseLoss.UNKNOWN),
    ],
)
def test_a_wall_clock_jump_outranks_what_a_pause_leads_to(
    row: tuple[object, ...], cause: LeaseLoss
) -> None:
    wall = FakeClock(0.0)
    term = _term(5.0, wall=wall)
    term.extend(100.0, 0.0)
    wall.now += 20.0  # paused 20 s; the monotonic clock stood still
    found, reason = why_check_failed(term, row)
    assert found is cause
    assert reason.endswith(
        "(the wall clock jumped 20.0s ahead of the monotonic clock since the last renewal:"
        " this host was paused, or its clock was stepped)"
    )


def test_a_fenced_producer_after_a_pause_is_blamed_on_the_pause() -> None:
    wall = FakeClock(0.0)
    term = _term(5.0, wall=wall)
    term.extend(100.0, 0.0)
    assert blame_jump(term, LeaseLoss.FENCED, "fenced") == (LeaseLoss.FENCED, "fenced")
    wall.now += 3.0
    cause, why = blame_jump(term, LeaseLoss.FENCED, "fenced")
    assert cause is LeaseLoss.CLOCK_JUMP
    assert why.startswith("fenced (the wall clock jumped 3.0s ahead")


def _scripted(monkeypatch: pytest.MonkeyPatch, *answers: object) -> list[dict[str, object]]:
    """db.rows_async answering in turn (an exception is raised, a coroutine function awaited);
    returns the parameters each call was given."""
    given: list[dict[str, object]] = []
    queue = list(answers)

    async def rows_async(_conn: object, _query: object, params: dict[str, object]) -> object:
        given.append(params)
        answer = queue.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            return await answer()
        return answer

    monkeypatch.setattr(lease_loss.db, "rows_async", rows_async)
    return given


async def _renew(terms: Sequence[LeaseTerm]) -> list[LeaseTerm]:
    store = LeaseStore("outboxkit", clock=FakeClock(100.0), wall=FakeClock(0.0))
    return await store.renew_many(None, list(terms))  # type: ignore[arg-type]


async def test_a_refused_renewal_reads_the_rows_back_in_one_statement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ok, taken, expired = _term(5.0, 0), _term(5.0, 1), _term(-1.0, 2)
    rows = [(1, 9, "B", NOW, NOW), (2, 7, "A", NOW - timedelta(seconds=3), NOW)]
    given = _scripted(monkeypatch, [(0,)], rows)
    assert await _renew([ok, taken, expired]) == [taken, expired]
    assert given[1] == {"group": "g", "shards": [1, 2], "now": None}
    assert ok.lost_reason is None
    assert ok.trusted_for() > 5.0  # extended by the renewal
    assert taken.lost_cause is LeaseLoss.TAKEN_OVER
    assert taken.lost_reason == (
        "renewal matched no lease row: taken over (token 9 now, held by B)"
    )
    assert expired.lost_cause is LeaseLoss.EXPIRED


@pytest.mark.parametrize("failure", ["error", "other", "cancelled"])
async def test_a_failed_read_back_costs_no_renewal_and_still_marks_the_lost(
    monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """The read-back runs under the renewer's timeout: whatever becomes of it, the renewed terms
    keep their renewal and the lost ones are marked lost."""
    lost, ok = _term(5.0, 0), _term(5.0, 1)

    async def hangs() -> object:
        await asyncio.Event().wait()
        return []

    answer: object = {
        "error": psycopg.OperationalError("connection lost"),
        "other": OSError("socket closed"),
        "cancelled": hangs,
    }[failure]
    _scripted(monkeypatch, [(1,)], answer)
    if failure == "cancelled":
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(_renew([lost, ok]), 0.05)
    else:
        assert await _renew([lost, ok]) == [lost]
    assert ok.lost_reason is None
    assert ok.trusted_for() > 5.0
    assert lost.lost_cause is LeaseLoss.UNKNOWN
    assert (
        lost.lost_reason
        == "renewal matched no lease row: "
        + {
            "error": "expired or taken over (the lease row could not be read:"
            " OperationalError: connection lost)",
            "other": "expired or taken over (the lease row could not be read:"
            " OSError: socket closed)",
            "cancelled": "expired or taken over (the lease row could not be read)",
        }[failure]
    )
