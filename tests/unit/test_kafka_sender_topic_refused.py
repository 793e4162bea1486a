"""A dead letter's or acknowledgement's topic whose Write was revoked while the consumer runs:
the error names the ACL, and aiokafka's producer, which numbered the refused record, is
replaced so later records are not refused ``OutOfOrderSequenceNumber`` (real-broker behaviour:
tests/fault/test_kafka_acls_consumer.py)."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from outboxkit.errors import PermanentPublishError, PublishError
from outboxkit.kafka.acl import REFUSAL_PAUSE, TopicRefusal, publish_failure
from outboxkit.settings import KafkaSettings
from tests.support.clock import Clock

pytestmark = pytest.mark.unit


def test_a_refused_topic_names_the_acl_and_other_failures_are_unchanged() -> None:
    refused = publish_failure("p.dlq", "TOPIC_AUTHORIZATION_FAILED", "Topic authorization failed")
    assert refused == (
        "publish to 'p.dlq' failed: TOPIC_AUTHORIZATION_FAILED: Topic authorization failed"
        " (grant the consumer's principal Write and Describe on 'p.dlq')"
    )
    assert "Write and Describe on 'p.acks'" in publish_failure(
        "p.acks", "TopicAuthorizationFailedError", "[Error 29]"
    )
    assert publish_failure("p.acks", "_MSG_TIMED_OUT", "late") == (
        "publish to 'p.acks' failed: _MSG_TIMED_OUT: late"
    )


def test_a_refused_topic_holds_for_the_pause_and_only_that_topic() -> None:
    clock = Clock()
    refusal = TopicRefusal(clock)
    refusal.check("p.dlq")  # nothing refused yet
    error = refusal.refused("p.dlq", "publish to 'p.dlq' failed: refused")
    assert isinstance(error, PermanentPublishError)
    clock.now += REFUSAL_PAUSE - 0.1
    with pytest.raises(PermanentPublishError, match=r"'p\.dlq' failed: refused"):
        refusal.check("p.dlq")
    refusal.check("p.acks")  # another topic is tried
    clock.now += 0.1
    refusal.check("p.dlq")  # tried again: Write may have been granted
    refusal.check("p.dlq")


class ScriptedProducer:
    """``send_and_wait`` raises the next of ``failures`` (``None``: delivered)."""

    def __init__(self, failures: list[Exception | None]) -> None:
        self.failures = failures
        self.sent = 0
        self.stopped = False

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    async def send_and_wait(self, topic: str, value: Any, **kwargs: Any) -> None:
        self.sent += 1
        failure = self.failures.pop(0)
        if failure is not None:
            raise failure

    async def stop(self) -> None:
        self.stopped = True


def _aiokafka_sender(producers: list[ScriptedProducer]) -> Any:
    pytest.importorskip("aiokafka")
    from outboxkit.kafka.aiokafka_sender import AiokafkaRecordSender

    sender = AiokafkaRecordSender(KafkaSettings(bootstrap="127.0.0.1:1", client="aiokafka"))
    queue = list(producers)

    async def get() -> ScriptedProducer:
        if sender._producer is None:
            sender._producer = queue.pop(0)
        return sender._producer  # type: ignore[no-any-return]

    sender._get = get  # type: ignore[method-assign]
    return sender


def test_aiokafka_replaces_its_producer_after_a_refused_record_and_holds_the_topic() -> None:
    pytest.importorskip("aiokafka")
    from aiokafka.errors import TopicAuthorizationFailedError

    first = ScriptedProducer([None, TopicAuthorizationFailedError("p.dlq")])
    second = ScriptedProducer([None])
    sender = _aiokafka_sender([first, second])

    async def run() -> None:
        await sender.send("p.acks", b"k", b"1", [])
        with pytest.raises(PermanentPublishError, match=r"Write and Describe on 'p\.dlq'"):
            await sender.send("p.dlq", b"k", b"2", [])
        assert first.stopped  # it numbered the refused record: dropped
        with pytest.raises(PermanentPublishError, match=r"Write and Describe on 'p\.dlq'"):
            await sender.send("p.dlq", b"k", b"3", [])  # held: no new producer for it
        assert sender._producer is None  # none made (a connection and a login each)
        assert second.sent == 0
        await sender.send("p.acks", b"k", b"4", [])  # another topic: a new producer
        assert second.sent == 1

    asyncio.run(run())


def test_aiokafka_replaces_its_producer_after_any_failed_record() -> None:
    pytest.importorskip("aiokafka")
    from aiokafka.errors import KafkaTimeoutError, OutOfOrderSequenceNumber

    first = ScriptedProducer([OutOfOrderSequenceNumber()])
    second = ScriptedProducer([KafkaTimeoutError()])
    third = ScriptedProducer([None])
    sender = _aiokafka_sender([first, second, third])

    async def run() -> None:
        with pytest.raises(PublishError, match="OutOfOrderSequenceNumber") as caught:
            await sender.send("p.acks", b"k", b"1", [])
        assert not isinstance(caught.value, PermanentPublishError)  # retried, with a new one
        with pytest.raises(PublishError, match="KafkaTimeoutError"):
            await sender.send("p.acks", b"k", b"1", [])
        await sender.send("p.acks", b"k", b"1", [])
        assert (first.stopped, second.stopped, third.stopped) == (True, True, False)
        assert third.sent == 1

    asyncio.run(run())


def test_aiokafka_gives_a_record_up_after_its_timeout_without_waiting_for_kafka() -> None:
    """aiokafka's idempotent producer retries a record for as long as Kafka is away, and its
    stop() waits for it: the send ends after the sender's timeout, and the producer is closed
    without stop() (its sender task cancelled, its client closed); the next record has a new
    one. The real client against a stopped broker: tests/fault/test_kafka_away_send.py."""
    pytest.importorskip("aiokafka")

    class NeverAcknowledged(ScriptedProducer):
        def __init__(self) -> None:
            super().__init__([])
            self.client = types.SimpleNamespace(close=self._close_client, closed=False)
            self._sender = types.SimpleNamespace(
                sender_task=asyncio.ensure_future(asyncio.Event().wait())  # retries for ever
            )

        async def _close_client(self) -> None:
            self.client.closed = True

        async def send_and_wait(self, topic: str, value: Any, **kwargs: Any) -> None:
            self.sent += 1
            await asyncio.Event().wait()  # Kafka away

        async def stop(self) -> None:
            await asyncio.Event().wait()  # flushes first: waits for the queued record

    async def run() -> None:
        away, back = NeverAcknowledged(), ScriptedProducer([None])
        sender = _aiokafka_sender([away, back])
        sender._timeout = 0.05
        with pytest.raises(PublishError, match="not acknowledged within") as caught:
            await sender.send("p.acks", b"k", b"1", [])
        assert not isinstance(caught.value, PermanentPublishError)
        assert away._sender.sender_task.cancelled()
        assert away.client.closed
        await sender.send("p.acks", b"k", b"1", [])
        assert back.sent == 1

    asyncio.run(asyncio.wait_for(run(), 10))


def test_an_abandoned_aiokafka_producer_leaves_no_request_waiting_for_metadata() -> None:
    """As aiokafka's sender does: cancelled, its routine awaits its requests in flight, and one
    whose connection timed out waits for the metadata update that only the client's updater
    (cancelled by ``client.close()``) completes. Without an answer both waited for ever."""
    pytest.importorskip("aiokafka")
    from outboxkit.kafka.aiokafka_stop import abandon_producer

    async def run() -> None:
        loop = asyncio.get_running_loop()
        closed: list[bool] = []

        async def close() -> None:
            closed.append(True)  # cancels the updater: the update future stays pending

        client = types.SimpleNamespace(_md_update_fut=loop.create_future(), close=close)

        async def request() -> None:  # re-enqueued its batch, now waits for fresh metadata
            await asyncio.shield(client._md_update_fut)

        in_flight = asyncio.ensure_future(request())

        async def routine() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await in_flight  # aiokafka's sender lets its requests end

        producer = types.SimpleNamespace(
            client=client,
            _sender=types.SimpleNamespace(sender_task=asyncio.ensure_future(routine())),
        )
        await asyncio.sleep(0)  # the routine runs
        await abandon_producer(producer, 0.05)
        assert closed == [True]
        assert in_flight.done()
        assert producer._sender.sender_task.done()
        assert producer._closed

    asyncio.run(asyncio.wait_for(run(), 10))


def test_aiokafka_drops_a_producer_whose_stop_fails_or_hangs() -> None:
    """The record's own error is the one raised, whatever stopping the dropped producer does."""
    pytest.importorskip("aiokafka")
    from aiokafka.errors import KafkaTimeoutError

    class StopFails(ScriptedProducer):
        async def stop(self) -> None:
            raise RuntimeError("stop failed")

    class StopHangs(ScriptedProducer):
        async def stop(self) -> None:
            await asyncio.Event().wait()

    sender = _aiokafka_sender(
        [
            StopFails([KafkaTimeoutError()]),
            StopHangs([KafkaTimeoutError()]),
            ScriptedProducer([None]),
        ]
    )
    sender._timeout = 0.05

    async def run() -> None:
        for _ in range(2):
            with pytest.raises(PublishError, match="KafkaTimeoutError"):
                await sender.send("p.acks", b"k", b"1", [])
        await sender.send("p.acks", b"k", b"1", [])

    asyncio.run(asyncio.wait_for(run(), 10))
