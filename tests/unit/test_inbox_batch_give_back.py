"""A batch that fails as a whole gives back every claim it did not settle, wherever it failed
(from the claim on), so its run is not an attempt of each record; and a payload whose
validation raises anything (not only a ``ValidationError``) is that record's rejection, not a
failure of its batch. Driven by the scripted executor of :mod:`tests.unit.test_inbox_batch`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pydantic
import pytest

from outboxkit.errors import DecodeError
from outboxkit.inbox import Envelope, EventRegistry, InboxSettings, OutcomeKind
from outboxkit.inbox.batch import deliver_batch
from outboxkit.inbox.delivery import InboxCore
from outboxkit.inbox.lease import LeaseHandle
from outboxkit.inbox.policy import RetryPolicy
from outboxkit.inbox.steps import CallHandler, StartLease, Step, drive_sync
from tests.unit.test_inbox_batch import _db, _env, _sql
from tests.unit.test_inbox_core import ONE, Script, _core

pytestmark = pytest.mark.unit


class Picky(pydantic.BaseModel):
    n: int

    @pydantic.field_validator("n")
    @classmethod
    def _not_13(cls, value: int) -> int:
        if value == 13:
            raise TypeError("unlucky 13")  # pydantic wraps only ValueError and AssertionError
        return value


def _picky(event_id: str, offset: int, n: int) -> Envelope:
    return Envelope.from_parts(
        topic="t",
        partition=0,
        offset=offset,
        key=b"k",
        value=b'{"n": %d}' % n,
        headers=[("event-id", event_id.encode()), ("event-type", b"picky")],
    )


def _picky_core() -> InboxCore:
    registry = EventRegistry()
    registry.register(Picky, event_type="picky")
    settings = InboxSettings(consumer="c", registry=registry, policy=RetryPolicy(max_attempts=1))
    return InboxCore(settings, lambda e, c, s: None, coroutines=False)


def _failing(base: Callable[[Step], Any], name: str) -> Callable[[Step], Any]:
    """``base``, except that the statement (or step type) called ``name`` raises."""

    def answer(step: Step) -> Any:
        if getattr(getattr(step, "query", None), "name", type(step).__name__) == name:
            raise RuntimeError(f"{name} failed: connection reset")
        return base(step)

    return answer


def _released(script: Script) -> list[list[str]]:
    return [r["event_ids"] for r in _sql(script, "release_batch")]


def test_a_validator_raising_a_type_error_rejects_its_record_and_the_batch_goes_on() -> None:
    envs = [_picky("ok1", 0, 1), _picky("bad", 1, 13), _picky("ok2", 2, 2)]
    script = Script(_db({"ok1": 1, "bad": 1, "ok2": 1}))
    result = drive_sync(
        deliver_batch(_picky_core(), envs, lambda tp: False, lambda *a: None), script
    )
    kinds = [(o.event_id, o.kind, o.attempts) for _, o in result.outcomes]
    assert kinds == [
        ("ok1", OutcomeKind.SUCCEEDED, 1),
        ("bad", OutcomeKind.REJECTED, 1),
        ("ok2", OutcomeKind.SUCCEEDED, 1),
    ]
    reason = "payload of 'picky' could not be decoded: TypeError: unlucky 13"
    assert result.outcomes[1][1].error == reason
    finish = _sql(script, "finish")
    assert [(f["event_id"], f["state"], f["error"]) for f in finish] == [
        ("bad", "rejected", reason)
    ]
    assert _sql(script, "mark_succeeded_batch")[0]["event_ids"] == ["ok1", "ok2"]
    assert _released(script) == []


def test_a_validator_raising_a_type_error_rejects_a_single_delivery_too() -> None:
    def answer(step: Step) -> Any:
        if isinstance(step, StartLease):
            return LeaseHandle(step.event_id, step.token, 0.0)
        name = getattr(getattr(step, "query", None), "name", "")
        if name == "claim":
            return type(ONE)([(7, 1, None)], 1)
        return ONE

    script = Script(answer)
    outcome = drive_sync(_picky_core().deliver(_picky("bad", 1, 13)), script)
    assert (outcome.kind, outcome.error) == (
        OutcomeKind.REJECTED,
        "payload of 'picky' could not be decoded: TypeError: unlucky 13",
    )
    assert "CallHandler" not in script.names()
    with pytest.raises(DecodeError):  # the registry says so itself, for any caller
        _picky_core().settings.registry.decode("picky", "application/json", b'{"n": 13}')


@pytest.mark.parametrize(
    ("failing", "released"),
    [
        ("get_state", ["a", "b", "c"]),  # the look-up of dup, a record not claimed
        ("finish", ["a", "b", "c"]),  # the rejection of b, whose payload is not JSON
        ("StartLeases", ["a", "c"]),  # b was rejected (settled) before
    ],
)
def test_a_batch_failing_before_its_transaction_gives_every_unsettled_claim_back(
    failing: str, released: list[str]
) -> None:
    """No handler ran, so no claim may count as an attempt: with ``max_attempts=1`` each
    would otherwise come back as a takeover and end dead, its handler never called."""
    envs = [_env("a", 0), _env("dup", 1), _env("b", 2), _env("c", 0, partition=1)]
    envs[2] = Envelope.from_parts(
        topic="orders",
        partition=0,
        offset=2,
        key=b"k",
        value=b"not json",
        headers=[("event-id", b"b"), ("event-type", b"order.cancelled")],
    )
    script = Script(_failing(_db({"a": 1, "b": 1, "c": 1}), failing))  # dup: not claimed
    with pytest.raises(RuntimeError, match="connection reset"):
        drive_sync(deliver_batch(_core(1), envs, lambda tp: False, lambda *a: None), script)
    assert "OpenHandler" not in script.names()
    assert _released(script) == [released]
    assert script.names()[-3:] == ["CloseHandler", "release_batch", "EndDelivery"]


def test_settling_after_the_commit_gives_unrun_claims_back_first_and_keeps_a_failed_run() -> None:
    """bad fails and b waits behind it; recording bad's failure fails: b was given back before
    that (settling may wait on Kafka); a, committed, is left alone, and so is bad: its handler
    ran and failed, an attempt that counts (given back, it would run again for free, e.g. a
    second dead letter with max_attempts=1)."""
    envs = [_env("a", 0, partition=1), _env("bad", 0), _env("b", 1)]
    script = Script(_failing(_db({"a": 1, "bad": 1, "b": 1}, fails={"bad"}), "record_failure"))
    with pytest.raises(RuntimeError, match="record_failure failed"):
        drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    assert "CommitHandler" in script.names()
    assert _released(script) == [["b"]]
    names = script.names()
    assert names.index("release_batch") < names.index("record_failure")


def test_a_takeover_that_fails_keeps_its_claim_and_the_rest_are_given_back_once() -> None:
    """The takeover runs alone; the claims behind it are given back at once. Its run then fails
    outside its handler: it is one delivery, whose attempt counts (its claim is not given
    back), and theirs are not given back a second time (each release takes an attempt back)."""
    base = _db({"again": 2, "x": 1, "y": 1})

    def answer(step: Step) -> Any:
        if isinstance(step, CallHandler):
            raise RuntimeError("handler failed")
        return base(step)

    envs = [_env("again", 0), _env("x", 1), _env("y", 2)]
    script = Script(_failing(answer, "record_failure"))
    with pytest.raises(RuntimeError, match="record_failure failed"):
        drive_sync(deliver_batch(_core(), envs, lambda tp: False, lambda *a: None), script)
    assert _released(script) == [["x", "y"]]


def test_a_give_back_that_fails_is_logged_and_the_batch_error_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = _failing(_db({"a": 1, "b": 1}), "StartLeases")
    script = Script(_failing(base, "release_batch"))
    with (
        caplog.at_level("WARNING", logger="outboxkit.inbox.batch"),
        pytest.raises(RuntimeError, match="StartLeases failed"),
    ):
        drive_sync(
            deliver_batch(_core(), [_env("a", 0), _env("b", 1)], lambda tp: False, _no), script
        )
    assert any("not given back" in m for m in caplog.messages)
    assert script.names()[-1] == "EndDelivery"


def _no(*args: Any) -> None:
    return None


def test_a_give_back_that_failed_is_made_before_the_next_batch_claims() -> None:
    """Owed (the server gone): made before the records are claimed again, or each claim, a
    takeover, would count the failed batch's run after all."""
    core = _core()
    base = _failing(_db({"a": 1, "b": 1}), "StartLeases")
    envs = [_env("a", 0), _env("b", 1)]
    with pytest.raises(RuntimeError, match="StartLeases failed"):
        drive_sync(
            deliver_batch(core, envs, lambda tp: False, _no),
            Script(_failing(base, "release_batch")),
        )
    assert set(core.owed.claims) == {"a", "b"}
    script = Script(_db({"a": 1, "b": 1}))
    drive_sync(deliver_batch(core, envs, lambda tp: False, _no), script)
    assert script.names()[:2] == ["release_batch", "claim_batch"]
    assert _released(script)[0] == ["a", "b"]
    assert core.owed.claims == {}
