"""A stop while a dead letter or an acknowledgement waits for Kafka: the send is given up after
its grace, and the record is held (not ``dead`` without its dead letter): it is delivered again
at the next start, and the dead letter is published then."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import pytest

from outboxkit.errors import SendStoppedError
from outboxkit.inbox import Envelope, OutcomeKind
from outboxkit.inbox import kafka_steps as steps_module
from outboxkit.inbox.acks import Acknowledger, GoneBudget, HeldAck, publish_gone
from outboxkit.inbox.kafka_steps import kafka_steps
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.steps import Publish, Step, drive_sync
from outboxkit.kafka import confluent_sender
from outboxkit.kafka.api import AsyncRecordSender, Headers, RecordSender
from outboxkit.kafka.confluent_sender import ConfluentRecordSender
from outboxkit.settings import KafkaSettings
from tests.unit.test_inbox_core import NONE, ONE, Script, _core, _db, _env, _name

pytestmark = pytest.mark.unit


def _stopped_letter(env: Envelope, event_id: str, error: str, attempts: int) -> Step:
    return Publish("orders.dlq", env.key, env.value, [])


def _db_stopping_the_send(step: Step) -> Any:
    if isinstance(step, Publish):
        raise SendStoppedError("orders.dlq")
    return _db((7, 3, "earlier"))(step)


def test_a_stopped_dead_letter_holds_the_event_with_the_handlers_error() -> None:
    script = Script(_db_stopping_the_send)
    outcome = drive_sync(_core(max_attempts=3).deliver(_env(), dead_letter=_stopped_letter), script)
    assert outcome.kind is OutcomeKind.RETRY  # held: its offset stays, it comes again
    assert outcome.retry_in > 0  # a consumer polled on after its stop is not spun
    names = script.names()
    assert names.index("Publish") < names.index("record_failure")  # the error, for next time
    assert "finish" not in names  # not dead without its dead letter
    failure = script.steps[names.index("record_failure")]
    assert "handler failed" in failure.params["error"]  # type: ignore[attr-defined]


def test_a_stopped_dead_letter_of_a_takeover_keeps_the_error_on_its_row() -> None:
    """Exhausted when taken over (the handler is not run): the row's error is already there."""
    script = Script(_db_stopping_the_send)
    outcome = drive_sync(_core(max_attempts=2).deliver(_env(), dead_letter=_stopped_letter), script)
    assert outcome.kind is OutcomeKind.RETRY
    assert "record_failure" not in script.names()
    assert "finish" not in script.names()


def test_a_stopped_dead_letter_of_a_row_cancelled_meanwhile_is_a_lost_lease() -> None:
    def answer(step: Step) -> Any:
        if _name(step) == "record_failure":
            return NONE  # the row is not ours any more (cancelled during the wait)
        return _db_stopping_the_send(step)

    script = Script(answer)
    outcome = drive_sync(_core(max_attempts=3).deliver(_env(), dead_letter=_stopped_letter), script)
    assert outcome.kind is OutcomeKind.LEASE_LOST
    assert "finish" not in script.names()


class _SyncSender(RecordSender):
    """A sender whose sends the stop ends, counting them."""

    def __init__(self) -> None:
        self.sends = 0

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        stop: threading.Event | None = None,
    ) -> None:
        self.sends += 1
        if stop is not None and stop.is_set():
            raise SendStoppedError(topic)

    def topic_exists(self, topic: str, stop: threading.Event | None = None) -> bool:
        return True

    def close(self) -> None:
        pass


def test_after_a_stopped_send_the_next_ones_fail_at_once_while_the_stop_lasts() -> None:
    sender, stop = _SyncSender(), threading.Event()
    publish = kafka_steps(object(), sender, lambda: stop)[Publish]  # type: ignore[arg-type]
    step = Publish("orders.dlq", b"k", b"v", [])
    stop.set()
    for _ in range(3):
        with pytest.raises(SendStoppedError):
            publish(step)
    assert sender.sends == 1  # one grace, not one per partition's record
    stop.clear()  # an embedded consumer run again
    publish(step)
    assert sender.sends == 2


class _Sender(AsyncRecordSender):
    """A sender whose send is answered once ``answered`` is set (or never)."""

    def __init__(self) -> None:
        self.answered = asyncio.Event()
        self.cancelled = False

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> None:
        try:
            await self.answered.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    async def topic_exists(self, topic: str) -> bool:
        return True

    async def close(self) -> None:
        pass


def _publish(sender: _Sender, stop: asyncio.Event) -> Any:
    table = kafka_steps(object(), sender, lambda: stop)  # type: ignore[arg-type]
    return table[Publish](Publish("orders.dlq", b"k", b"v", []))


def test_an_async_send_still_waiting_after_its_grace_ends_at_a_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(steps_module, "SEND_GRACE_SECONDS", 0.05)

    async def scenario() -> bool:
        sender, stop = _Sender(), asyncio.Event()
        stop.set()  # stopping already (as when a batch's dead letter comes after the SIGTERM)
        with pytest.raises(SendStoppedError):
            await asyncio.wait_for(_publish(sender, stop), 5)
        return sender.cancelled

    assert asyncio.run(scenario())  # the sender's own clean-up ran (it closes its producer)


def test_an_async_send_answered_within_its_grace_goes_through_at_a_stop() -> None:
    async def scenario() -> None:
        sender, stop = _Sender(), asyncio.Event()
        stop.set()  # a clean shutdown's last acknowledgements: Kafka answers
        sender.answered.set()
        await asyncio.wait_for(_publish(sender, stop), 5)

    asyncio.run(scenario())


def test_an_async_send_without_a_stop_waits_for_its_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(steps_module, "SEND_GRACE_SECONDS", 0.01)

    async def scenario() -> bool:
        sender, stop = _Sender(), asyncio.Event()
        task = asyncio.ensure_future(_publish(sender, stop))
        await asyncio.sleep(0.1)  # well past the grace: still waiting
        assert not task.done()
        sender.answered.set()
        await asyncio.wait_for(task, 5)
        return sender.cancelled

    assert asyncio.run(scenario()) is False


def _refuse_publish(step: Step) -> Any:
    if isinstance(step, Publish):
        raise SendStoppedError(step.topic)
    return ONE


def test_a_stopped_acknowledgement_holds_its_record_without_counting_a_failure() -> None:
    acks = Acknowledger("c", "billing.acks", attempts=2)
    outcome = Outcome(OutcomeKind.SUCCEEDED, "e1", 1)
    for _ in range(3):  # more stops than attempts: never given up for them
        held = drive_sync(acks.acknowledge(_env(), outcome), Script(_refuse_publish))
        assert isinstance(held, HeldAck)
    assert acks.failures == {}


def test_a_stopped_acknowledgement_of_a_gone_record_ends_its_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script, budget = Script(_refuse_publish), GoneBudget()
    record = (b"e1", b"{}", [])
    drive_sync(publish_gone("billing.acks", "c", "e1", record, ("o", 0, 1), budget), script)
    drive_sync(publish_gone("billing.acks", "c", "e2", record, ("o", 0, 2), budget), script)
    assert script.names() == ["Publish"]  # one try, none after it in the round
    assert "given up as the consumer stops" in caplog.text


def test_a_confluent_send_kafka_does_not_answer_ends_at_a_stop_after_its_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real librdkafka producer, with nothing listening on its broker's port."""
    monkeypatch.setattr(confluent_sender, "SEND_GRACE_SECONDS", 0.3)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sender = ConfluentRecordSender(KafkaSettings(bootstrap=f"127.0.0.1:{port}"), timeout=30)
    stop = threading.Event()
    stop.set()
    began = time.monotonic()
    with pytest.raises(SendStoppedError, match="given up: the consumer is stopping"):
        sender.send("orders.dlq", b"k", b"v", [], stop)
    assert time.monotonic() - began < 10  # not the sender's 30 s timeout
    assert sender._producer is None  # dropped with its record purged: a close does not wait
    sender.close()
