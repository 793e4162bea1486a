"""A stop (``KeyboardInterrupt``, ``SystemExit``, the task's cancellation) in a batch: the driver
tells the executor the step it came in, and the batch's claims decide what is given back (the
plan's decision; the executors only run it, see ``test_inbox_batch_stop`` in the integration
tests). Driven by the scripted executor of :mod:`tests.unit.test_inbox_batch`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from outboxkit.db import Result
from outboxkit.inbox.batch import deliver_batch
from outboxkit.inbox.batch_claims import BatchClaims, OwedClaims
from outboxkit.inbox.steps import (
    ClaimsHeld,
    CommitHandler,
    Plan,
    RunInTransaction,
    Sleep,
    Sql,
    Step,
    drive_sync,
)
from outboxkit.inbox.store import Claim, InboxStatements
from tests.unit.test_inbox_batch import _db, _env
from tests.unit.test_inbox_core import Script, _core

pytestmark = pytest.mark.unit


def _stopping_at(base: Callable[[Step], Any], at: Callable[[Step], bool]) -> Callable[[Step], Any]:
    def answer(step: Step) -> Any:
        if at(step):
            raise KeyboardInterrupt
        return base(step)

    return answer


def _handler_of(event_id: str) -> Callable[[Step], bool]:
    return lambda s: isinstance(s, RunInTransaction) and s.args[1].event_id == event_id


def _named(name: str) -> Callable[[Step], bool]:
    return lambda s: getattr(getattr(s, "query", None), "name", type(s).__name__) == name


def _stopped(script: Script) -> list[str] | None:
    """What the batch gives back for the stop the script saw: event ids, or ``None``."""
    held = next(s for s in script.steps if isinstance(s, ClaimsHeld))
    step = next(held.claims.at_stop(script.in_flight[-1]), None)
    if step is None:
        return None
    assert isinstance(step, Sql)
    assert step.query.name == "release_stopped_batch"
    return list(step.params["event_ids"])


def _run(answer: Callable[[Step], Any], *event_ids: str) -> Script:
    script = Script(answer)
    envs = [_env(event_id, n) for n, event_id in enumerate(event_ids)]
    with pytest.raises(KeyboardInterrupt):
        drive_sync(deliver_batch(_core(1), envs, lambda tp: False, lambda *a: None), script)
    assert script.released == 1
    return script


def test_a_stop_in_a_handler_charges_that_handler_only() -> None:
    script = _run(_stopping_at(_db({"a": 1, "b": 1, "c": 1}), _handler_of("b")), "a", "b", "c")
    assert isinstance(script.in_flight[-1], RunInTransaction)
    assert _stopped(script) == ["a", "c"]


@pytest.mark.parametrize("at", ["mark_succeeded_batch", "StartLeases", "OpenHandler"])
def test_a_stop_outside_the_handlers_charges_nobody(at: str) -> None:
    script = _run(_stopping_at(_db({"a": 1, "b": 1}), _named(at)), "a", "b")
    assert _stopped(script) == ["a", "b"]


def test_a_stop_in_the_commit_keeps_the_failed_runs_counted() -> None:
    """b failed in the batch; the commit was sent: its run counts (given back, it would run
    again for free). a and c are given back: the statement skips them if they committed."""
    base = _db({"a": 1, "b": 1, "c": 1}, fails={"b"})
    script = _run(_stopping_at(base, lambda s: isinstance(s, CommitHandler)), "a", "b", "c")
    assert _stopped(script) == ["a", "c"]


def test_a_failed_commit_counts_no_run() -> None:
    """The commit raised: the batch fails as a whole, every unsettled claim given back."""
    base = _db({"a": 1, "b": 1}, fails={"b"})

    def answer(step: Step) -> Any:
        if isinstance(step, CommitHandler):
            raise RuntimeError("connection lost in the commit")
        return base(step)

    script = Script(answer)
    envs = [_env("a", 0), _env("b", 1)]
    with pytest.raises(RuntimeError, match="in the commit"):
        drive_sync(deliver_batch(_core(1), envs, lambda tp: False, lambda *a: None), script)
    sql = [s for s in script.steps if isinstance(s, Sql)]
    assert [s.params["event_ids"] for s in sql if s.query.name == "release_batch"] == [["a", "b"]]


def test_a_takeover_run_alone_stays_charged() -> None:
    """again (attempts 2) ran alone, its transaction its own; x behind it was given back."""
    base = _db({"again": 2, "x": 1})
    script = _run(_stopping_at(base, _named("EndDelivery")), "again", "x")
    assert script.in_flight[-1] is not None
    assert _stopped(script) is None


def test_a_batch_handlers_call_charges_all_of_its_events() -> None:
    claims = BatchClaims(_statements())
    claims.held = {e: Claim.claimed(n, 1, None) for n, e in enumerate("abc", start=1)}
    contexts = (SimpleNamespace(event_id="a"), SimpleNamespace(event_id="b"))
    call = RunInTransaction(lambda *a: None, ([], contexts), contexts)
    step = next(claims.at_stop(call))
    assert isinstance(step, Sql)
    assert step.params["event_ids"] == ["c"]
    assert step.params["tokens"] == [3]


def test_a_give_back_that_fails_at_a_stop_is_owed_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owed = OwedClaims(_statements())
    claims = BatchClaims(_statements(), owed)
    claims.held = {"a": Claim.claimed(7, 1, None)}
    plan = claims.at_stop(None)
    next(plan)
    with (
        caplog.at_level(logging.WARNING, logger="outboxkit.inbox.batch"),
        pytest.raises(StopIteration),
    ):
        plan.throw(RuntimeError("server gone"))
    assert owed.claims == {"a": 7}
    assert "claims of a stopped batch not given back: RuntimeError: server gone" in caplog.text


def test_a_give_back_at_a_stop_is_owed_until_made_and_tells_rows_it_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Owed before it is sent: a second stop (a timeout, another cancellation) may cut it short,
    and a process that goes on consuming then makes it before claiming those events again."""
    owed = OwedClaims(_statements())
    claims = BatchClaims(_statements(), owed)
    claims.held = {"a": Claim.claimed(7, 1, None), "b": Claim.claimed(8, 1, None)}
    plan = claims.at_stop(None)
    next(plan)
    assert owed.claims == {"a": 7, "b": 8}
    with (
        caplog.at_level(logging.INFO, logger="outboxkit.inbox.batch"),
        pytest.raises(StopIteration),
    ):
        plan.send(Result([], 1))  # one row was held by another transaction
    assert owed.claims == {}
    assert "1 of 2 claims held by another transaction stay counted" in caplog.text


def _statements() -> InboxStatements:
    return InboxStatements("c", owner="o")


def _stops_between_steps() -> Plan[None]:
    yield Sleep(1)
    raise KeyboardInterrupt


def test_the_driver_tells_the_step_a_stop_came_in() -> None:
    script = Script(_stopping_at(lambda s: None, lambda s: isinstance(s, Sleep)))
    with pytest.raises(KeyboardInterrupt):
        drive_sync(_stops_between_steps(), script)
    assert script.in_flight == [Sleep(1)]

    script = Script(lambda s: None)
    with pytest.raises(KeyboardInterrupt):
        drive_sync(_stops_between_steps(), script)
    assert script.in_flight == [None]  # in the plan's own code: no step was running
