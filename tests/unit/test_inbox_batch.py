"""The batch plan driven by a scripted executor: what one claim, one transaction, an optimistic
run without savepoints and the run again with a savepoint per handler decide, without a
database or Kafka."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from outboxkit.db import Result
from outboxkit.errors import (
    BatchTransactionEndedError,
    HandlerTransactionAbortedError,
    LeaseLostError,
)
from outboxkit.inbox import Envelope, OutcomeKind
from outboxkit.inbox.batch import deliver_batch
from outboxkit.inbox.lease import LeaseHandle
from outboxkit.inbox.steps import (
    RunInSavepoint,
    RunInTransaction,
    StartLease,
    StartLeases,
    Step,
    drive_sync,
)
from tests.unit.test_inbox_core import ONE, Script, _core

pytestmark = pytest.mark.unit


def _env(event_id: str, offset: int, partition: int = 0) -> Envelope:
    return Envelope.from_parts(
        topic="orders",
        partition=partition,
        offset=offset,
        key=b"k",
        value=b'{"order_id": "o1"}',
        headers=[("event-id", event_id.encode()), ("event-type", b"order.cancelled")],
    )


def _db(
    attempts: dict[str, int],
    fails: set[str] = frozenset(),
    refused: set[str] = frozenset(),
    errors: dict[str, Exception] | None = None,
    mark_fails: int = 0,
) -> Callable[[Step], Any]:
    marks = [0]

    def answer(step: Step) -> Any:
        if isinstance(step, RunInTransaction):
            event_id = step.args[1].event_id
            if event_id in fails:
                raise RuntimeError("handler failed")
            if errors and event_id in errors:
                raise errors[event_id]
        if isinstance(step, StartLease):
            return LeaseHandle(step.event_id, step.token, 0.0)
        if isinstance(step, StartLeases):
            return [LeaseHandle(event_id, token, 0.0) for event_id, token in step.claims]
        name = getattr(getattr(step, "query", None), "name", "")
        if name == "claim_batch":
            rows = [(e, n, a, None) for n, (e, a) in enumerate(attempts.items(), start=1)]
            return Result(rows, len(rows))
        if name == "mark_succeeded_batch":
            marks[0] += 1
            if marks[0] <= mark_fails:
                raise RuntimeError("current transaction is aborted")
            ids = [e for e in step.params["event_ids"] if e not in refused]  # type: ignore[attr-defined]
            return Result([(e,) for e in ids], len(ids))
        if name == "get_state":
            return Result([("processing", None)], 1)
        return ONE

    return answer


def _sql(script: Script, name: str) -> list[Any]:
    return [
        s.params for s in script.steps if getattr(getattr(s, "query", None), "name", "") == name
    ]


def _runs(script: Script) -> list[tuple[str, str]]:
    """``(mode, event id)`` of every handler run, in order."""
    return [
        ("savepoint" if isinstance(s, RunInSavepoint) else "optimistic", s.args[1].event_id)
        for s in script.steps
        if isinstance(s, RunInTransaction)
    ]


def test_a_failure_rolls_back_alone_and_holds_its_partition() -> None:
    envs = [_env("a", 0), _env("bad", 1), _env("b", 2), _env("f", 0, partition=1)]
    script = Script(_db({"a": 1, "bad": 1, "b": 1, "f": 1}, fails={"bad"}))
    result = drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    kinds = [(env.headers["event-id"], o.kind) for env, o in result.outcomes]
    assert kinds == [
        ("a", OutcomeKind.SUCCEEDED),
        ("bad", OutcomeKind.RETRY),
        ("f", OutcomeKind.SUCCEEDED),
    ]
    assert result.rest == []  # b waits behind bad: the seek back to bad delivers it again
    assert len(_sql(script, "claim_batch")) == 1
    assert _sql(script, "mark_succeeded_batch")[0]["event_ids"] == ["a", "f"]
    assert _sql(script, "release_batch")[0]["event_ids"] == ["b"]  # not counted as an attempt
    assert script.names().count("CommitHandler") == 1
    # The optimistic run stops at bad; the batch runs again with savepoints, bad left out (its
    # failure is known) and b held behind it.
    assert _runs(script) == [
        ("optimistic", "a"),
        ("optimistic", "bad"),
        ("savepoint", "a"),
        ("savepoint", "f"),
    ]
    assert script.names().count("OpenHandler") == 2
    attempts = {o.event_id: o.attempts for _, o in result.outcomes}
    assert attempts == {"a": 1, "bad": 1, "f": 1}  # one claim: the rolled-back run is no attempt
    assert result.reruns == 1  # counted for the metric of batches that ran again


def test_a_batch_that_succeeds_runs_once_without_savepoints() -> None:
    envs = [_env("a", 0), _env("b", 1), _env("c", 0, partition=1)]
    script = Script(_db({"a": 1, "b": 1, "c": 1}))
    result = drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    assert [o.kind for _, o in result.outcomes] == [OutcomeKind.SUCCEEDED] * 3
    assert _runs(script) == [("optimistic", "a"), ("optimistic", "b"), ("optimistic", "c")]
    names = script.names()
    assert (names.count("OpenHandler"), names.count("CommitHandler")) == (1, 1)
    assert "CloseHandler" not in names
    assert result.reruns == 0


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (HandlerTransactionAbortedError("left aborted"), OutcomeKind.RETRY),
        (LeaseLostError("lease lost: partition revoked"), OutcomeKind.LEASE_LOST),
    ],
)
def test_an_aborted_transaction_or_lost_lease_in_the_optimistic_run_is_that_handlers_alone(
    error: Exception, kind: OutcomeKind
) -> None:
    envs = [_env("a", 0), _env("x", 0, partition=1), _env("b", 1)]
    script = Script(_db({"a": 1, "x": 1, "b": 1}, errors={"x": error}))
    result = drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    kinds = {o.event_id: o.kind for _, o in result.outcomes}
    assert kinds == {"a": OutcomeKind.SUCCEEDED, "x": kind, "b": OutcomeKind.SUCCEEDED}
    assert _runs(script) == [
        ("optimistic", "a"),
        ("optimistic", "x"),
        ("savepoint", "a"),
        ("savepoint", "b"),
    ]
    assert [m["event_ids"] for m in _sql(script, "mark_succeeded_batch")] == [["a", "b"]]
    assert result.reruns == 1


def test_a_failing_mark_after_the_optimistic_run_runs_every_handler_again_in_savepoints() -> None:
    envs = [_env("a", 0), _env("b", 1)]
    script = Script(_db({"a": 1, "b": 1}, mark_fails=1))
    result = drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    assert [o.kind for _, o in result.outcomes] == [OutcomeKind.SUCCEEDED] * 2
    assert _runs(script) == [
        ("optimistic", "a"),
        ("optimistic", "b"),
        ("savepoint", "a"),
        ("savepoint", "b"),
    ]
    assert script.names().count("CommitHandler") == 1
    assert result.reruns == 1


def test_a_failing_mark_with_savepoints_ends_the_batch() -> None:
    """The loop then delivers the batch one event at a time."""
    envs = [_env("a", 0), _env("b", 1)]
    script = Script(_db({"a": 1, "b": 1}, mark_fails=2))
    with pytest.raises(RuntimeError):
        drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    assert script.names()[-1] == "EndDelivery"
    assert "CommitHandler" not in script.names()
    # Given back: the run that failed as a whole is not an attempt of a or b.
    assert [r["event_ids"] for r in _sql(script, "release_batch")] == [["a", "b"]]
    # ... after the failed transaction is rolled back (its row locks would block the give-back).
    names = script.names()
    assert names[-4:] == ["mark_succeeded_batch", "CloseHandler", "release_batch", "EndDelivery"]


def test_a_handler_ending_the_transaction_gives_the_claims_back_and_ends_the_batch() -> None:
    envs = [_env("a", 0), _env("undo", 1), _env("b", 2)]
    ended = BatchTransactionEndedError("rolled back")
    script = Script(_db({"a": 1, "undo": 1, "b": 1}, errors={"undo": ended}))
    with pytest.raises(BatchTransactionEndedError):
        drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    assert _runs(script) == [("optimistic", "a"), ("optimistic", "undo")]
    assert [r["event_ids"] for r in _sql(script, "release_batch")] == [["a", "undo", "b"]]


def test_a_takeover_runs_alone_and_the_rest_comes_again() -> None:
    envs = [_env("again", 0), _env("x", 1), _env("y", 2)]
    script = Script(_db({"again": 2, "x": 1, "y": 1}))
    result = drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    assert [(env.headers["event-id"], o.kind) for env, o in result.outcomes] == [
        ("again", OutcomeKind.SUCCEEDED)
    ]
    assert result.rest == [1, 2]
    assert _sql(script, "release_batch")[0]["event_ids"] == ["x", "y"]
    assert "CallHandler" in script.names()  # its own transaction
    assert "OpenHandler" not in script.names()


def test_a_refused_mark_rolls_the_batch_back_and_runs_the_others_again() -> None:
    envs = [_env("a", 0), _env("gone", 0, partition=1), _env("c", 1)]
    script = Script(_db({"a": 1, "gone": 1, "c": 1}, refused={"gone"}))
    result = drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    outcomes = {env.headers["event-id"]: o.kind for env, o in result.outcomes}
    assert outcomes == {
        "a": OutcomeKind.SUCCEEDED,
        "gone": OutcomeKind.LEASE_LOST,
        "c": OutcomeKind.SUCCEEDED,
    }
    names = script.names()
    assert names.count("OpenHandler") == 2
    assert names.count("CloseHandler") >= 1
    assert names.count("CommitHandler") == 1
    assert _sql(script, "mark_succeeded_batch")[1]["event_ids"] == ["a", "c"]
    assert [mode for mode, _ in _runs(script)] == ["optimistic"] * 3 + ["savepoint"] * 2
    assert result.reruns == 1
