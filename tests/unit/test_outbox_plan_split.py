"""add_many's INSERT path split into statements of bounded size (pure logic of ``Plan``).

PostgreSQL closes the connection on a protocol message over 1 GB, so one INSERT carrying every
row of a large call lost the caller's transaction. The plan now hands out the rows in INSERTs
of at most ``INSERT_MAX_BYTES`` (estimated), each at least one row.
"""

from __future__ import annotations

import uuid

import pytest

from outboxkit import outbox_plan
from outboxkit.errors import IdempotencyKeyConflictError
from outboxkit.events import Message
from outboxkit.outbox_plan import OutboxConfig, Plan, prepare

pytestmark = pytest.mark.unit

QUIET = OutboxConfig(notify=False)


def _plan(count: int, config: OutboxConfig = QUIET, size: int = 1000) -> Plan:
    return Plan(
        config, [prepare(Message("t", b"x" * size, key=f"{n:03d}"), config) for n in range(count)]
    )


def _write_all(plan: Plan, taken: dict[str, tuple[uuid.UUID, bytes]] | None = None) -> list[int]:
    """Run the plan against a pretend table holding ``taken`` keys; the rows per INSERT."""
    taken = dict(taken or {})
    sizes = []
    next_id = 1
    while True:
        name, params = plan.insert_statement((None, []))
        keys = (
            params["idempotency_keys"]
            if name.startswith("insert_many")
            else [params["idempotency_key"]]
        )
        ids = params["event_ids"] if name.startswith("insert_many") else [params["event_id"]]
        sizes.append(len(keys))
        written = []
        for key, event_id in zip(keys, ids, strict=True):
            if key not in taken:
                written.append((next_id, event_id))
                next_id += 1
        plan.take_inserted(written)
        reread = plan.reread_statement()
        if reread is not None:
            asked = reread[1]["idempotency_keys"]
            plan.take_reread([(k, *taken[k]) for k in asked if k in taken])
        if not plan.needs_retry():
            return sizes


def test_a_call_under_the_bound_is_one_insert() -> None:
    plan = _plan(50)
    assert _write_all(plan) == [50]
    assert [r.id for r in plan.outcome()] == list(range(1, 51))


def test_a_call_over_the_bound_is_split_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    row_bytes = outbox_plan._row_bytes(_plan(1).rows[0])
    monkeypatch.setattr(outbox_plan, "INSERT_MAX_BYTES", 10 * row_bytes)
    plan = _plan(35)
    assert _write_all(plan) == [10, 10, 10, 5]
    results = plan.outcome()
    assert [r.id for r in results] == list(range(1, 36))
    assert [r.event_id for r in results] == [row.event_id for row in plan.rows]


def test_a_row_larger_than_the_bound_goes_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox_plan, "INSERT_MAX_BYTES", 10)
    plan = _plan(3)
    assert _write_all(plan) == [1, 1, 1]
    assert not any(r.duplicate for r in plan.outcome())


def test_duplicates_in_later_inserts_are_read_back_with_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    row_bytes = outbox_plan._row_bytes(_plan(1).rows[0])
    monkeypatch.setattr(outbox_plan, "INSERT_MAX_BYTES", 4 * row_bytes)
    plan = _plan(12)
    existing = {
        plan.rows[i].idempotency_key: (uuid.uuid4(), plan.rows[i].content_digest) for i in (1, 9)
    }
    # Each INSERT with a taken key is re-read once; none counts towards giving up.
    assert _write_all(plan, existing) == [4, 4, 4]
    results = plan.outcome()
    assert [r.duplicate for r in results] == [i in (1, 9) for i in range(12)]
    assert results[9].event_id == existing[plan.rows[9].idempotency_key][0]


def test_many_inserts_with_taken_keys_do_not_give_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Giving up counts rows whose conflicting row vanished, not re-reads: a call split in more
    INSERTs than the re-read limit, each with a duplicate, still settles."""
    monkeypatch.setattr(outbox_plan, "INSERT_MAX_BYTES", 10)
    plan = _plan(8)
    existing = {row.idempotency_key: (uuid.uuid4(), row.content_digest) for row in plan.rows}
    assert _write_all(plan, existing) == [1] * 8
    assert all(r.duplicate for r in plan.outcome())


def test_other_content_in_a_later_insert_is_the_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox_plan, "INSERT_MAX_BYTES", 10)
    plan = _plan(4)
    existing = {plan.rows[3].idempotency_key: (uuid.uuid4(), b"other digest")}
    _write_all(plan, existing)
    with pytest.raises(IdempotencyKeyConflictError):
        plan.outcome()


def test_rows_that_keep_vanishing_give_up() -> None:
    plan = _plan(2)
    rounds = 0
    while True:
        plan.insert_statement((None, []))
        plan.take_inserted([])  # both keys taken ...
        assert plan.reread_statement() is not None
        plan.take_reread([])  # ... and gone again when read
        rounds += 1
        if not plan.needs_retry():
            break
    assert rounds == outbox_plan._MAX_REREADS
    with pytest.raises(IdempotencyKeyConflictError, match="keep disappearing"):
        plan.outcome()


def test_a_later_insert_does_not_notify_a_shard_an_earlier_one_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outbox_plan, "INSERT_MAX_BYTES", 10)
    config = OutboxConfig(notify=True)
    plan = _plan(3, config)
    name, params = plan.insert_statement(("41", [7]))
    assert (name, params["notified_xact"], params["notified_shards"]) == ("insert_one", "41", [7])
    plan.take_inserted([(1, plan.rows[0].event_id, 2, "42", True)])  # a new transaction
    name, params = plan.insert_statement(("41", [7]))
    assert (params["notified_xact"], params["notified_shards"]) == ("42", [2])
    plan.take_inserted([(2, plan.rows[1].event_id, 3, "42", True)])
    name, params = plan.insert_statement(("42", [7]))
    assert (params["notified_xact"], params["notified_shards"]) == ("42", [2, 3, 7])


def test_text_counts_its_utf8_bytes() -> None:
    """psycopg sends text as UTF-8: a header of 4-byte characters weighs four times its length
    (counted by length, a statement carried 1.07 GB)."""
    ascii_row = _plan(1, size=0).rows[0]
    wide = prepare(Message("t", b"", key="000", headers={"h": "\U0001f600" * 1000}), QUIET)
    narrow = prepare(Message("t", b"", key="000", headers={"h": "x" * 1000}), QUIET)
    assert outbox_plan._row_bytes(narrow) - outbox_plan._row_bytes(ascii_row) >= 1000
    assert outbox_plan._row_bytes(wide) - outbox_plan._row_bytes(narrow) == 3000
