"""A missing ACL met by the consumer's clients: said once per refusal and interval, no record
sent twice, no producer made per record while the producer id is refused, and a refused topic
beside a readable one does not slow the readable one down (real-broker behaviour:
tests/fault/test_kafka_acls_consumer.py)."""

from __future__ import annotations

import asyncio
import logging
import types
from typing import Any

import pytest

from outboxkit.errors import PermanentPublishError, PublishError
from outboxkit.kafka import acl
from outboxkit.kafka.acl import NOTICE_INTERVAL, REFUSAL_PAUSE, ProducerIdRefusal, RefusalNotice
from outboxkit.settings import KafkaSettings
from tests.support.clock import Clock

pytestmark = pytest.mark.unit


def test_a_refusal_is_said_once_per_interval_and_each_kind_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    notice = RefusalNotice(logging.getLogger("test.refusal"), clock)
    with caplog.at_level(logging.WARNING, logger="test.refusal"):
        for _ in range(50):
            notice.refused("topic a")
            notice.refused("group g")
        clock.now += NOTICE_INTERVAL
        notice.refused("topic a")
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 3
    assert said[0].startswith("Kafka refused this consumer (topic a): grant its principal Read")
    assert said[1].startswith("Kafka refused this consumer (group g)")
    assert said[2].startswith("Kafka refused this consumer (topic a)")


def test_a_refused_producer_id_holds_for_the_pause_then_is_tried_again() -> None:
    clock = Clock()
    refusal = ProducerIdRefusal(clock)
    refusal.check("acks")  # nothing refused yet
    error = refusal.refused("acks", "CLUSTER_AUTHORIZATION_FAILED: no")
    assert isinstance(error, PermanentPublishError)
    assert "'acks' failed: CLUSTER_AUTHORIZATION_FAILED: no" in str(error)
    assert acl.IDEMPOTENT_ACL_HINT in str(error)
    clock.now += REFUSAL_PAUSE - 0.1
    with pytest.raises(PermanentPublishError, match="'dlq' failed: CLUSTER_AUTHORIZATION_FAILED"):
        refusal.check("dlq")
    clock.now += 0.1
    refusal.check("dlq")  # tried again: the ACL may have been granted


# --- confluent-kafka: the sender's producer replaced by a scripted one ---------------------


def _confluent() -> Any:
    return pytest.importorskip("confluent_kafka")


class ScriptedProducer:
    """``produce`` raises ``on_produce`` if set; ``flush`` reports ``delivery`` to the callback."""

    made = 0

    def __init__(self, on_produce: Exception | None, delivery: Any) -> None:
        ScriptedProducer.made += 1
        self.on_produce, self.delivery = on_produce, delivery
        self.produced = 0
        self._callback: Any = None
        self.listing: int | bool | None = False  # list_topics: no answer (False), found, error

    def produce(self, topic: str, value: Any, **kwargs: Any) -> None:
        if self.on_produce is not None:
            raise self.on_produce
        self.produced += 1
        self._callback = kwargs["on_delivery"]

    def flush(self, timeout: float) -> int:
        if self._callback is not None:
            self._callback(self.delivery, None)
        return 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        """The cluster's answer about ``topic``: ``self.listing`` (an error code, or None: it
        exists), or no answer (Kafka away) while it is False."""
        kafka = _confluent()
        if self.listing is False:
            raise kafka.KafkaException(kafka.KafkaError(kafka.KafkaError._TRANSPORT))
        error = None if self.listing is None else kafka.KafkaError(self.listing)
        return types.SimpleNamespace(topics={topic: types.SimpleNamespace(error=error)})


def _sender(monkeypatch: pytest.MonkeyPatch, producers: list[ScriptedProducer]) -> Any:
    from outboxkit.kafka import confluent_sender

    queue = list(producers)
    monkeypatch.setattr(confluent_sender, "create", lambda *args: queue.pop(0))
    return confluent_sender.ConfluentRecordSender(KafkaSettings(bootstrap="127.0.0.1:1"))


def test_a_record_whose_own_delivery_failed_fatally_is_not_sent_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kafka = _confluent()
    fatal = kafka.KafkaError(kafka.KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "broken", fatal=True)
    first = ScriptedProducer(None, None)
    second = ScriptedProducer(None, fatal)
    third = ScriptedProducer(None, None)
    sender = _sender(monkeypatch, [first, third])
    sender.send("acks", b"k", b"1", [])  # a first producer, healthy
    sender._producer = second  # (as if it had been replaced)
    with pytest.raises(PublishError, match="OUT_OF_ORDER_SEQUENCE_NUMBER: broken") as caught:
        sender.send("acks", b"k", b"2", [])
    assert not isinstance(caught.value, PermanentPublishError)
    assert second.produced == 1
    assert third.produced == 0  # not sent again: it may have been written
    sender.send("acks", b"k", b"3", [])  # the dead producer was dropped
    assert third.produced == 1


def test_a_producer_dead_before_the_record_is_replaced_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kafka = _confluent()
    died = kafka.KafkaException(kafka.KafkaError(kafka.KafkaError._FATAL, "Unable to produce"))
    dead = ScriptedProducer(died, None)
    fresh = ScriptedProducer(None, None)
    sender = _sender(monkeypatch, [dead, fresh])
    sender.send("dlq", b"k", b"v", [])
    assert fresh.produced == 1


def test_no_producer_is_made_per_record_while_the_producer_id_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kafka = _confluent()
    refused = kafka.KafkaError(
        kafka.KafkaError.CLUSTER_AUTHORIZATION_FAILED, "no producer id", fatal=True
    )
    ScriptedProducer.made = 0
    producers = [ScriptedProducer(None, refused) for _ in range(5)]
    sender = _sender(monkeypatch, producers)
    for _ in range(5):
        with pytest.raises(PermanentPublishError, match="CLUSTER_AUTHORIZATION_FAILED") as caught:
            sender.send("acks", b"k", b"v", [])
        assert acl.IDEMPOTENT_ACL_HINT in str(caught.value)
    assert sum(p.produced for p in producers) == 1


# --- aiokafka: a refused topic beside a readable one ---------------------------------------


class ScriptedConsumer:
    def __init__(self, script: list[Any]) -> None:
        self.script = script

    async def getmany(self, timeout_ms: int, max_records: int) -> Any:
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def test_a_refused_topic_beside_a_readable_one_is_said_once_and_costs_no_wait(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("aiokafka")
    from aiokafka.errors import TopicAuthorizationFailedError

    from outboxkit.kafka import aiokafka_consumer

    consumer = aiokafka_consumer.AiokafkaGroupConsumer(
        KafkaSettings(bootstrap="127.0.0.1:1", client="aiokafka"), "g"
    )
    refused = TopicAuthorizationFailedError({"secret-topic"})
    script: list[Any] = []
    for _ in range(10):
        script += [{}, refused]  # aiokafka alternates: what it has, then the refusal
    script += [refused, refused, refused]
    consumer._consumer = ScriptedConsumer(script)  # type: ignore[assignment]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(aiokafka_consumer.asyncio, "sleep", sleep)

    async def polls() -> None:
        for _ in range(23):
            assert await consumer.poll(0.5, 10) == []

    with caplog.at_level(logging.WARNING, logger="outboxkit.kafka.consumer"):
        asyncio.run(polls())
    assert slept == [0.5, 0.5, 0.5]  # only refusals running back to back wait: no spin, no drag
    said = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(said) == 1
    assert "secret-topic" in said[0]
    assert acl.CONSUMER_ACL_HINT in said[0]


class FlushRaises(ScriptedProducer):
    def flush(self, timeout: float) -> int:
        raise self.delivery


def test_a_non_fatal_error_keeps_the_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = _confluent()
    timed_out = kafka.KafkaError(kafka.KafkaError._MSG_TIMED_OUT, "Message timed out")
    producer = ScriptedProducer(None, timed_out)
    flush_fails = FlushRaises(None, kafka.KafkaException(timed_out))
    producer.listing = flush_fails.listing = None  # the topic exists: no wait for an answer
    sender = _sender(monkeypatch, [producer])
    for _ in range(2):
        with pytest.raises(PublishError, match="_MSG_TIMED_OUT"):
            sender.send("acks", b"k", b"v", [])
    assert producer.produced == 2  # the same producer both times: it is not dead
    sender._producer = flush_fails
    for _ in range(2):
        with pytest.raises(PublishError, match="_MSG_TIMED_OUT"):
            sender.send("acks", b"k", b"v", [])
    assert flush_fails.produced == 2


@pytest.mark.parametrize("exists", [True, False])
def test_a_timed_out_record_is_refused_for_good_only_for_a_topic_the_cluster_lacks(
    monkeypatch: pytest.MonkeyPatch, exists: bool
) -> None:
    """librdkafka times a record to a missing topic out like one while Kafka is away."""
    kafka = _confluent()
    timed_out = kafka.KafkaError(kafka.KafkaError._MSG_TIMED_OUT, "Message timed out")
    producer = ScriptedProducer(None, timed_out)
    producer.listing = None if exists else kafka.KafkaError.UNKNOWN_TOPIC_OR_PART
    sender = _sender(monkeypatch, [producer])
    with pytest.raises(PublishError) as raised:
        sender.send("acks", b"k", b"v", [])
    assert isinstance(raised.value, PermanentPublishError) is not exists
    assert ("does not exist" in str(raised.value)) is not exists


def test_aiokafka_keeps_a_record_the_client_refused_itself_out_of_an_acl_refusal() -> None:
    pytest.importorskip("aiokafka")
    from outboxkit.kafka.aiokafka_producer import _explained
    from outboxkit.kafka.api import Delivery, RecordError

    local = Delivery(error=RecordError("MessageSizeTooLargeError", "too big", local=True))
    assert _explained(local, "orders", {"audit"}) is local
    failed = Delivery(error=RecordError("InvalidTxnState", "bare"))
    explained = _explained(failed, "orders", {"audit"})
    assert explained is not None
    assert explained.error is not None
    assert "may not write to 'audit'" in explained.error.message


def test_aiokafkas_own_refused_fetch_line_is_let_through_once_per_interval() -> None:
    from outboxkit.kafka.acl import RefusedFetchFilter

    clock = Clock()
    refused = RefusedFetchFilter(clock)

    def record(message: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord("aiokafka.consumer.fetcher", logging.WARNING, "", 0, message,
                                 args, None)  # fmt: skip

    passed = [refused.filter(record(RefusedFetchFilter.MESSAGE, "t")) for _ in range(50)]
    assert passed.count(True) == 1
    assert refused.filter(record(RefusedFetchFilter.MESSAGE, "other"))  # another topic
    assert refused.filter(record("Fetch offset %s is out of range", 7))  # other lines untouched
    clock.now += NOTICE_INTERVAL
    assert refused.filter(record(RefusedFetchFilter.MESSAGE, "t"))
