"""The batch plan driven by a scripted executor: what one claim, one transaction and a savepoint
per handler decide, without a database or Kafka."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from outboxkit.db import Result
from outboxkit.inbox import Envelope, OutcomeKind
from outboxkit.inbox.batch import deliver_batch
from outboxkit.inbox.lease import LeaseHandle
from outboxkit.inbox.steps import RunInSavepoint, StartLease, Step, drive_sync
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
    attempts: dict[str, int], fails: set[str] = frozenset(), refused: set[str] = frozenset()
) -> Callable[[Step], Any]:
    def answer(step: Step) -> Any:
        if isinstance(step, RunInSavepoint) and step.args[1].event_id in fails:
            raise RuntimeError("handler failed")
        if isinstance(step, StartLease):
            return LeaseHandle(step.event_id, step.token, 0.0)
        name = getattr(getattr(step, "query", None), "name", "")
        if name == "claim_batch":
            rows = [(e, n, a, None) for n, (e, a) in enumerate(attempts.items(), start=1)]
            return Result(rows, len(rows))
        if name == "mark_succeeded_batch":
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
