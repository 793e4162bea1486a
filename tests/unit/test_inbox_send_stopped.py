"""A stop while a dead letter waits for Kafka: the send is given up after its first slice, and
the event is left unsettled (not ``dead`` without its dead letter): its record is delivered
again after a restart, and the dead letter is published then."""

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
from outboxkit.inbox import loop as loop_module
from outboxkit.inbox.acks import Acknowledger, GoneBudget, HeldAck, publish_gone
from outboxkit.inbox.kafka_steps import kafka_steps
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.steps import Plan, Poll, Publish, Step, Subscribe, drive_sync
from outboxkit.kafka import confluent_sender
from outboxkit.kafka.api import AsyncRecordSender, Headers
from outboxkit.kafka.confluent_sender import ConfluentRecordSender
from outboxkit.settings import KafkaSettings
from tests.unit.test_inbox_core import ONE, Script, _core, _db, _env, _loop, _record

pytestmark = pytest.mark.unit


def _stopped_letter(env: Envelope, event_id: str, error: str, attempts: int) -> Step:
    return Publish("orders.dlq", env.key, env.value, [])


def _db_stopping_the_send(step: Step) -> Any:
    if isinstance(step, Publish):
        raise SendStoppedError("orders.dlq")
    return _db((7, 3, "earlier"))(step)


def test_a_stopped_dead_letter_leaves_the_event_unsettled() -> None:
    script = Script(_db_stopping_the_send)
    with pytest.raises(SendStoppedError):
        drive_sync(_core().deliver(_env(), dead_letter=_stopped_letter), script)
    names = script.names()
    assert "Publish" in names
    assert "finish" not in names  # not marked dead: the next start publishes the dead letter


def _loop_whose_delivery_is_stopped(batch: int) -> Any:
    loop = _loop()
    loop.options = type(loop.options)(topics=["orders"], batch_max_records=batch)

    def deliver(env: Envelope, *args: Any) -> Plan[Outcome]:
        yield from ()
        raise SendStoppedError("orders.dlq")

    loop.core.deliver = deliver  # type: ignore[assignment]
    return loop


def _answer(step: Step) -> Any:
    if isinstance(step, Subscribe):
        step.on_assign([("orders", 0)])
        return None
    if isinstance(step, Poll):
        return [_record(0, 5)]
    return ONE


def test_a_stopped_delivery_goes_back_to_the_buffer_uncounted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = _loop_whose_delivery_is_stopped(batch=1)
    assert drive_sync(loop.poll_once(), Script(_answer)) is None
    assert [r.offset for r in loop.buffer] == [5]  # delivered again, not settled
    assert loop.failures == {}  # not an error of the record's
    assert "failed" not in caplog.text


def test_a_stopped_batch_goes_back_to_the_buffer_as_it_was(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stopped_batch(*args: Any) -> Plan[Any]:
        yield from ()
        raise SendStoppedError("orders.dlq")

    monkeypatch.setattr(loop_module, "deliver_batch", stopped_batch)
    polls = iter([[_record(0, 5), _record(0, 6)]])

    def answer(step: Step) -> Any:
        return next(polls, []) if isinstance(step, Poll) else _answer(step)

    loop = _loop()
    assert drive_sync(loop.poll_batch(), Script(answer)) == []
    assert [r.offset for r in loop.buffer] == [5, 6]
    assert loop.single == 0  # not "one by one": nothing failed
    assert "failed" not in caplog.text


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
