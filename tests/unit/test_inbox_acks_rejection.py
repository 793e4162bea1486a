"""Acknowledgements of deliveries refused into the rejection log say so (``rejection_log``):
a reused id, an old replay or an unsafe header says nothing of the event's own row, which may
be ``succeeded``; a delivery given up whose row was marked ``dead`` is acknowledged ``dead``, and
so is an event whose record, held for a retry, left the log.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from outboxkit.db import Result
from outboxkit.errors import PublishError
from outboxkit.inbox import Envelope, EventRegistry, InboxSettings, OutcomeKind
from outboxkit.inbox.acks import GONE_ACK_ATTEMPTS, ack_record
from outboxkit.inbox.delivery import InboxCore
from outboxkit.inbox.gate import Gone, end_gone
from outboxkit.inbox.loop import ConsumerLoop
from outboxkit.inbox.loop_options import LoopOptions
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.steps import (
    Plan,
    Poll,
    Publish,
    Step,
    Subscribe,
    TopicExists,
    drive_async,
    drive_sync,
)
from outboxkit.kafka.api import ConsumedRecord
from tests.unit.test_inbox_core import NONE, ONE, Script, _core, _db, _env, _name
from tests.unit.test_inbox_logic import Cancelled

pytestmark = pytest.mark.unit

ACKS = "billing.acks"
# The abandon statement's answer when it marked the row dead: the row's attempts (3).
MARKED_DEAD = Result([(3,)], 1)


def _body(outcome: Outcome, env: Envelope | None = None) -> dict[str, Any]:
    record = ack_record("c", env or _env(), outcome)
    assert record is not None
    key, value, _ = record
    assert key == (outcome.event_id or "").encode()
    body: dict[str, Any] = json.loads(value)
    return body


def _delivery(event_type: bytes, value: bytes = b"{}", timestamp_ms: int | None = None) -> Envelope:
    """Event e1 at orders/0/0 with the given type and value."""
    return Envelope.from_parts(
        topic="orders",
        partition=0,
        offset=0,
        key=b"k",
        value=value,
        headers=[("event-id", b"e1"), ("event-type", event_type)],
        timestamp_ms=timestamp_ms,
    )


def _reused(step: Step) -> Any:
    """The event id is taken by a ``succeeded`` row of other content."""
    name = _name(step)
    if name in ("claim", "claim_batch"):
        return NONE
    if name == "get_state":
        return Result([("succeeded", b"other content")], 1)
    return ONE


def test_a_reused_id_is_acknowledged_as_a_rejection_log_entry() -> None:
    script = Script(_reused)
    outcome = drive_sync(_core().deliver(_env()), script)
    assert script.names() == ["claim", "get_state", "record_rejection", "EndDelivery"]
    assert (outcome.kind, outcome.rejection_log, outcome.row_dead) == (
        OutcomeKind.REJECTED,
        True,
        False,
    )
    body = _body(outcome)
    assert (body["event_id"], body["state"], body["rejection_log"]) == ("e1", "rejected", True)
    assert "existing: succeeded" in body["error"]


def test_an_old_replay_of_a_forgotten_event_is_acknowledged_as_a_rejection_log_entry() -> None:
    registry = EventRegistry()
    registry.register(Cancelled)
    settings = InboxSettings(consumer="c", registry=registry, replay_window=60)
    core = InboxCore(settings, lambda e, c, s: None, coroutines=False)
    env = _delivery(b"order.cancelled", timestamp_ms=1_000)  # 1970: far older than the window
    script = Script(_db(None))  # no row: forgotten
    outcome = drive_sync(core.deliver(env), script)
    assert script.names() == ["get_state", "record_rejection", "EndDelivery"]
    body = _body(outcome, env)
    assert (body["state"], body["rejection_log"]) == ("rejected", True)
    assert "replay older than" in body["error"]


def test_an_unsafe_header_of_a_safe_event_id_is_acknowledged_as_a_rejection_log_entry() -> None:
    env = _delivery(b"x\x1b[31m")
    script = Script(_db((7, 1, None)))
    outcome = drive_sync(_core().deliver(env), script)
    assert script.names() == ["record_rejection", "EndDelivery"]
    assert outcome.event_id == "e1"
    body = _body(outcome, env)
    assert (body["state"], body["rejection_log"]) == ("rejected", True)


def test_a_rejection_on_the_events_own_row_is_acknowledged_as_its_state() -> None:
    """Undecodable after the claim: the row itself ends ``rejected`` (no flag)."""
    env = _delivery(b"order.cancelled", value=b"{broken")
    script = Script(_db((7, 1, None)))
    outcome = drive_sync(_core().deliver(env), script)
    assert script.names() == ["claim", "finish", "EndDelivery"]
    assert (outcome.kind, outcome.rejection_log) == (OutcomeKind.REJECTED, False)
    body = _body(outcome, env)
    assert body["state"] == "rejected"
    assert "rejection_log" not in body


@pytest.mark.parametrize(
    ("abandoned", "state", "flagged", "attempts"),
    [(MARKED_DEAD, "dead", False, 3), (NONE, "rejected", True, 0)],
    ids=["row-marked-dead", "no-unfinished-row"],
)
def test_a_delivery_given_up_is_acknowledged_dead_when_its_row_was_marked_dead(
    abandoned: Result, state: str, flagged: bool, attempts: int
) -> None:
    """The row marked ``dead`` is the event's state, and no later record would tell it: the
    producer hears ``dead``, with the row's attempts (as for any dead event). With no
    unfinished row (none, or already finished) only this delivery was refused."""

    def answer(step: Step) -> Any:
        return abandoned if _name(step) == "abandon" else ONE

    script = Script(answer)
    outcome = drive_sync(_core().give_up(_env(), "DataError: x", 5), script)
    assert script.names() == ["record_rejection", "abandon"]
    # What the metrics and the alert see is unchanged: a rejected outcome, alert given_up.
    assert (outcome.kind, outcome.alert) == (OutcomeKind.REJECTED, "given_up")
    assert (outcome.rejection_log, outcome.row_dead) == (True, state == "dead")
    body = _body(outcome)
    assert body["state"] == state
    assert body.get("rejection_log", False) is flagged
    assert (outcome.attempts, body["attempts"]) == (attempts, attempts)
    assert body["error"].startswith("gave up after 5 unexpected errors")


def _record(offset: int, event_id: bytes = b"e1") -> ConsumedRecord:
    headers = (("event-id", event_id), ("event-type", b"order.cancelled"))
    return ConsumedRecord("orders", 0, offset, b"k", b'{"order_id": "o1"}', headers, None)


def _polling(batches: list[list[ConsumedRecord]], db: Callable[[Step], Any]) -> Script:
    polls = iter(batches)

    def answer(step: Step) -> Any:
        if isinstance(step, Subscribe):
            step.on_assign([("orders", 0)])
        if isinstance(step, Poll):
            return next(polls)
        if isinstance(step, TopicExists):
            return True
        if isinstance(step, Publish):
            return None
        return db(step)

    return Script(answer)


def _acks(script: Script) -> list[dict[str, Any]]:
    return [json.loads(s.value or b"") for s in script.steps if isinstance(s, Publish)]


@pytest.mark.parametrize("batched", [True, False], ids=["batch", "one-by-one"])
def test_the_consumer_publishes_a_reused_id_flagged(batched: bool) -> None:
    options = LoopOptions(topics=["orders"], acks_topic=ACKS, batch_max_records=2 if batched else 1)
    loop = ConsumerLoop(_core(), options, clock=lambda: 1000.0)
    script = _polling([[_record(5)], [], []], _reused)
    outcomes = drive_sync(loop.poll_batch(), script)
    assert [o.kind for o in outcomes] == [OutcomeKind.REJECTED]
    assert [s.topic for s in script.steps if isinstance(s, Publish)] == [ACKS]
    [body] = _acks(script)
    assert (body["event_id"], body["state"], body["rejection_log"]) == ("e1", "rejected", True)


def test_the_consumer_acknowledges_a_record_given_up_with_its_row_dead() -> None:
    options = LoopOptions(topics=["orders"], acks_topic=ACKS, max_unexpected_errors=1)
    loop = ConsumerLoop(_core(), options, clock=lambda: 1000.0)

    def deliver(env: Envelope, *args: Any) -> Plan[Outcome]:
        yield from ()
        raise RuntimeError("a value the database refuses")

    loop.core.deliver = deliver  # type: ignore[method-assign,assignment]
    script = _polling([[_record(5)]], lambda step: MARKED_DEAD if _name(step) == "abandon" else ONE)
    outcome = drive_sync(loop.poll_once(), script)
    assert outcome is not None
    assert outcome.alert == "given_up"
    [body] = _acks(script)
    assert (body["event_id"], body["state"], body["attempts"]) == ("e1", "dead", 3)
    assert "rejection_log" not in body


# -- a record held for a retry that left the log (retention, compaction, delete_records) -------
# The abandon_gone statement's answer when it ended the row dead: the row's attempts (2).
GONE_DEAD = Result([(2,)], 1)
GONE_ERROR = (
    "its record (orders/0 at offset 5) left the log (retention, compaction or delete_records)"
    " while held for a retry"
)


def _gone(
    answer: Callable[[Step], Any], acks_topic: str | None = ACKS
) -> tuple[Script, Plan[None]]:
    script = Script(answer)
    gone = [Gone(("orders", 0), 5, "e1"), Gone(("orders", 0), 9, "e2")]
    return script, end_gone(gone, _core().statements, acks_topic)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_event_ended_dead_because_its_held_record_left_the_log_is_acknowledged(
    driver: str,
) -> None:
    """The row is ended ``dead`` with no delivery that could acknowledge it (the record is
    gone): without this record the producer would wait for ever. The same shape and headers as
    any acknowledgement, with the row's attempts and the reason written."""
    script, plan = _gone(lambda step: GONE_DEAD if _name(step) == "abandon_gone" else None)
    if driver == "sync":
        drive_sync(plan, script)
    else:
        asyncio.run(drive_async(plan, script))
    assert script.names() == ["abandon_gone", "Publish", "abandon_gone", "Publish"]
    first = script.steps[1]
    assert isinstance(first, Publish)
    assert first.topic == ACKS
    written = script.steps[0].params["error"]  # type: ignore[attr-defined]
    assert written == GONE_ERROR
    outcome = Outcome(OutcomeKind.DEAD, "e1", 2, error=written)
    assert (first.key, first.value, first.headers) == ack_record("c", _env(5), outcome)
    body = json.loads(first.value or b"")
    assert (body["consumer"], body["event_id"], body["state"]) == ("c", "e1", "dead")
    assert (body["attempts"], body["topic"], body["partition"], body["offset"]) == (
        2,
        "orders",
        0,
        5,
    )
    assert "rejection_log" not in body
    assert [b["offset"] for b in _acks(script)] == [5, 9]


def test_a_gone_record_whose_row_was_not_ended_here_is_not_acknowledged() -> None:
    """No row came back: a copy of the event at another offset took the row over (it is
    acknowledged when it ends), or the row finished meanwhile. No acks topic: no record."""
    script, plan = _gone(lambda step: NONE)
    drive_sync(plan, script)
    assert script.names() == ["abandon_gone", "abandon_gone"]
    script, plan = _gone(lambda step: GONE_DEAD, acks_topic=None)
    drive_sync(plan, script)
    assert script.names() == ["abandon_gone", "abandon_gone"]


def test_an_acknowledgement_of_a_gone_record_that_cannot_be_published_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No delivery of a gone record will ever come to acknowledge it again: its publish is
    tried again at once, then given up with an error naming where the outcome is. The tries of
    one round share one budget (no poll comes in between): the next gone record, left none, is
    given up untried, with an error too."""

    def answer(step: Step) -> Any:
        if isinstance(step, Publish):
            raise PublishError("broker away")
        return GONE_DEAD

    script, plan = _gone(answer)
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        drive_sync(plan, script)
    tries = ["Publish"] * GONE_ACK_ATTEMPTS
    assert script.names() == ["abandon_gone", *tries, "abandon_gone"]
    assert "acknowledgement for e1 not published: broker away" in caplog.messages
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        f"acknowledgement for e1 (orders/0 at offset 5) given up after {GONE_ACK_ATTEMPTS} failed"
        " publish(es): broker away; its outcome is in the database: outboxkit inbox show"
        " --consumer c --event-id e1",
        "acknowledgement for e2 (orders/0 at offset 9) given up untried (publishes just failed):"
        " broker away; its outcome is in the database: outboxkit inbox show --consumer c"
        " --event-id e2",
    ]


def test_the_consumer_acknowledges_a_held_record_that_left_the_log_dead() -> None:
    """Offset 5 fails and is held; it is deleted meanwhile, so the seek back resumes at 7. The
    event of 5 ends ``dead`` after 7 ran, and the acks topic hears of both."""
    now = [1000.0]
    options = LoopOptions(topics=["orders"], acks_topic=ACKS)
    loop = ConsumerLoop(_core(), options, clock=lambda: now[0])

    def deliver(env: Envelope, *args: Any) -> Plan[Outcome]:
        yield from ()
        if env.offset == 5:
            return Outcome(OutcomeKind.RETRY, "e1", 1, retry_in=10)
        return Outcome(OutcomeKind.SUCCEEDED, env.headers["event-id"], 1)

    loop.core.deliver = deliver  # type: ignore[method-assign,assignment]

    def db(step: Step) -> Any:
        return GONE_DEAD if _name(step) == "abandon_gone" else ONE

    script = _polling([[_record(5)], [_record(7, b"e2")], []], db)
    assert drive_sync(loop.poll_once(), script) is not None  # 5: held
    now[0] += 10  # the retry is due
    for _ in range(2):  # 7 runs (the hold ends), then the gone record's row ends dead
        drive_sync(loop.poll_once(), script)
    assert script.names().count("abandon_gone") == 1
    acks = _acks(script)
    assert [(b["event_id"], b["state"], b["offset"]) for b in acks] == [
        ("e2", "succeeded", 7),
        ("e1", "dead", 5),
    ]
    assert (acks[1]["attempts"], acks[1]["error"]) == (2, GONE_ERROR)


def test_the_flags_leave_an_outcomes_equality_as_it_was() -> None:
    """``Outcome`` is public: code comparing one with an outcome built without the flags (as
    before they existed) still finds them equal; the flags are read, not compared."""
    flagged = Outcome(OutcomeKind.REJECTED, "e1", error="x", rejection_log=True, row_dead=True)
    assert flagged == Outcome(OutcomeKind.REJECTED, "e1", error="x")
    assert hash(flagged) == hash(Outcome(OutcomeKind.REJECTED, "e1", error="x"))
