"""The demo's verification table can go red: each check flags the anomaly it is about."""

from __future__ import annotations

from collections import Counter

import pytest

from outboxkit.demo.checks import Faults, Outcome, judge, render
from outboxkit.demo.writers import WriteLog


def _log() -> WriteLog:
    """Two committed orders of three events each, one rolled-back placement."""
    log = WriteLog()
    for order in ("o1", "o2"):
        log.orders[order] = 100
        for seq in (1, 2, 3):
            log.committed[f"{order}-e{seq}"] = (order, seq)
    log.rolled_back.add("ghost-e1")
    log.rolled_back_transactions = 1
    return log


def _good() -> Outcome:
    applied = [(o, seq, f"{o}-e{seq}") for seq in (1, 2, 3) for o in ("o1", "o2")]
    return Outcome({"o1", "o2"}, Counter({"o1": 1, "o2": 1}), applied)


def _faults(**changes: object) -> Faults:
    values: dict[str, object] = {
        "takeover_seconds": 3.1,
        "token_before": 1,
        "token_after": 9,
        "consumer_killed": True,
        "duplicates_suppressed": 1,
        "takeover_limit": 8.0,
        "copies_in_kafka": 0,
    }
    values.update(changes)
    return Faults(**values)  # type: ignore[arg-type]


def _failed(outcome: Outcome, faults: Faults, log: WriteLog | None = None) -> set[str]:
    return {check.name for check in judge(log or _log(), outcome, faults) if not check.ok}


def test_a_clean_run_is_all_green() -> None:
    checks = judge(_log(), _good(), _faults())
    assert [check.name for check in checks if not check.ok] == []
    assert all(line.startswith("  \u2714") for line in render(checks, color=False))


def test_a_double_charge_is_flagged() -> None:
    outcome = _good()
    outcome.charges["o1"] = 2
    assert _failed(outcome, _faults()) == {"every committed order charged exactly once"}


def test_a_lost_event_is_flagged() -> None:
    outcome = _good()
    outcome.applied.pop()  # o2's shipped event never applied
    assert _failed(outcome, _faults()) == {
        "every committed event applied exactly once",
        "per-order event order kept",
    }  # the Kafka duplicate check reads the topic itself: a lost effect is not its business


def test_a_phantom_from_a_rolled_back_transaction_is_flagged() -> None:
    outcome = _good()
    outcome.applied.append(("ghost", 1, "ghost-e1"))
    outcome.charges["ghost"] = 1
    assert "nothing phantom from rolled-back transactions" in _failed(outcome, _faults())


def test_a_reordered_order_is_flagged() -> None:
    outcome = _good()
    outcome.applied[0], outcome.applied[2] = outcome.applied[2], outcome.applied[0]  # o1: 2, 1
    assert _failed(outcome, _faults()) == {"per-order event order kept"}


@pytest.mark.parametrize(
    "faults",
    [
        _faults(takeover_seconds=None),
        _faults(takeover_seconds=9.5),
        _faults(token_after=1),  # the token did not grow
    ],
)
def test_a_missing_slow_or_unfenced_takeover_is_flagged(faults: Faults) -> None:
    assert _failed(_good(), faults) == {"standby relay took over from the killed one"}


def test_a_consumer_kill_without_suppressed_redelivery_is_flagged() -> None:
    failed = _failed(_good(), _faults(duplicates_suppressed=0))
    assert "redelivered event suppressed by the inbox" in failed


def test_a_duplicate_in_kafka_is_flagged_and_consumer_redeliveries_are_not() -> None:
    failed = _failed(_good(), _faults(copies_in_kafka=1))
    assert failed == {"relay published nothing twice across its crash"}
    # A consumer killed after a batch's commit redelivers the whole batch: not a relay duplicate.
    assert _failed(_good(), _faults(duplicates_suppressed=5)) == set()


def test_writer_errors_are_flagged_and_red_when_coloured() -> None:
    log = _log()
    log.errors.append("writer 0: OperationalError: connection refused")
    checks = judge(log, _good(), _faults())
    assert [check.name for check in checks if not check.ok] == ["no writer errors"]
    assert any("\x1b[31m\u2718" in line for line in render(checks, color=True))
