"""One contract, two clients: the Kafka seam's producer, admin and checkpoint reader, built by
``KafkaClients`` over confluent-kafka and over aiokafka, pass the same tests on a real broker."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from outboxkit.errors import PermanentPublishError, ProducerFencedError, PublishError
from outboxkit.kafka import KafkaClients, aiokafka_producer, confluent_producer
from outboxkit.kafka.api import (
    NOT_SENT,
    Admin,
    CheckpointReader,
    ProduceRequest,
    TopicLimits,
    TransactionalProducer,
)
from outboxkit.kafka.config import LIBRDKAFKA_LOGGER
from outboxkit.kafka.errors import ErrorKind
from outboxkit.settings import KafkaClient, KafkaSettings
from tests.relay_support import (
    KAFKA_CLIENTS,
    consume,
)

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
ProducerFactory = Callable[..., TransactionalProducer]


def _clients(bootstrap: str, client: str) -> KafkaClients:
    return KafkaClients(KafkaSettings(bootstrap=bootstrap, client=KafkaClient(client)), timeout=15)


@pytest.fixture(params=KAFKA_CLIENTS)
def kafka(request: pytest.FixtureRequest, outboxkit_kafka_bootstrap: str) -> KafkaClients:
    return _clients(outboxkit_kafka_bootstrap, request.param)


@pytest.fixture
async def producers(kafka: KafkaClients) -> AsyncIterator[ProducerFactory]:
    created: list[TransactionalProducer] = []

    def make(transactional_id: str | None = None) -> TransactionalProducer:
        producer = kafka.transactional_producer(transactional_id)
        created.append(producer)
        return producer

    yield make
    for producer in created:
        await producer.close()


def _requests(topic: str, key: str, count: int) -> list[ProduceRequest]:
    return [
        ProduceRequest(topic, key.encode(), f"{key}-{n}".encode(), [("event-id", f"{n}".encode())])
        for n in range(count)
    ]


def _txn_id() -> str:
    return f"conformance-{uuid.uuid4().hex}"


# ------------------------------------------------------------------------------ producer


async def test_idempotent_send_acknowledges_in_order_with_headers(
    producers: ProducerFactory, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic(partitions=3)
    producer = producers()
    await producer.start()
    assert not producer.transactional
    deliveries = await producer.send(_requests(topic, "k", 10))
    assert all(d.error is None for d in deliveries)
    assert len({d.partition for d in deliveries}) == 1
    offsets = [d.offset for d in deliveries]
    assert offsets == sorted(offsets)
    got = consume(outboxkit_kafka_bootstrap, topic, expect=10, quiet=0.5)
    assert [r.value for r in got] == [f"k-{n}".encode() for n in range(10)]
    assert got[3].headers == {"event-id": "3"}


@pytest.mark.parametrize("transactional", [False, True])
async def test_a_send_larger_than_one_batch_per_partition_keeps_each_partitions_order(
    producers: ProducerFactory,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    transactional: bool,
) -> None:
    """Over 300 KiB per partition and two topics in one send (a claim and its checkpoint):
    every record acknowledged with its own offset, each partition read back in send order."""
    topic, other = outboxkit_topic(partitions=2), outboxkit_topic()
    producer = producers(_txn_id() if transactional else None)
    await producer.start()
    if transactional:
        await producer.begin()
    padding = b"p" * 1024
    requests = [
        ProduceRequest(topic, f"key-{n % 7}".encode(), b"%d:" % n + padding, [("n", b"%d" % n)])
        for n in range(700)
    ]
    requests.insert(350, ProduceRequest(other, b"checkpoint", b"c", ()))
    deliveries = await producer.send(requests)
    if transactional:
        await producer.commit()
    assert all(d.error is None for d in deliveries), deliveries
    by_partition: dict[int | None, list[int]] = {}
    for request, delivery in zip(requests, deliveries, strict=True):
        if request.topic == topic:
            assert delivery.offset is not None
            by_partition.setdefault(delivery.partition, []).append(delivery.offset)
    assert len(by_partition) == 2
    for offsets in by_partition.values():
        assert offsets == sorted(offsets)
        assert len(set(offsets)) == len(offsets)
    got = consume(outboxkit_kafka_bootstrap, topic, expect=700, quiet=0.5)
    assert len(got) == 700
    for partition in (0, 1):
        numbers = [int(r.value.split(b":")[0]) for r in got if r.partition == partition]
        assert numbers == sorted(numbers)
    assert [r.value for r in consume(outboxkit_kafka_bootstrap, other, expect=1)] == [b"c"]


async def test_a_record_above_the_request_size_stops_the_send(
    producers: ProducerFactory, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    """Refused before it is sent (both clients cap a request at 1 MiB): what came before it goes
    out, nothing after it is produced (NOT_SENT, retriable), so no later record of its key can
    overtake it."""
    topic = outboxkit_topic()
    producer = producers()
    await producer.start()
    requests = _requests(topic, "k", 3)
    requests.insert(1, ProduceRequest(topic, b"k", b"x" * (1024 * 1024 + 1)))
    deliveries = await producer.send(requests)
    assert deliveries[0].error is None
    assert deliveries[1].error is not None
    assert deliveries[1].error.kind is ErrorKind.PERMANENT, deliveries[1].error
    assert [d.error for d in deliveries[2:]] == [NOT_SENT.error, NOT_SENT.error]
    got = consume(outboxkit_kafka_bootstrap, topic, expect=1, quiet=0.5)
    assert [r.value for r in got] == [b"k-0"]


async def test_transaction_commit_is_visible_and_abort_is_not(
    producers: ProducerFactory, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    producer = producers(_txn_id())
    await producer.start()
    assert producer.transactional
    await producer.begin()
    assert all(d.error is None for d in await producer.send(_requests(topic, "kept", 3)))
    await producer.commit()
    await producer.begin()
    await producer.send(_requests(topic, "dropped", 3))
    await producer.abort()
    await producer.begin()
    await producer.send(_requests(topic, "kept2", 1))
    await producer.commit()
    got = consume(outboxkit_kafka_bootstrap, topic, expect=4, quiet=1.0)
    assert [r.value for r in got] == [b"kept-0", b"kept-1", b"kept-2", b"kept2-0"]


async def test_a_newer_producer_with_the_same_transactional_id_fences_the_old_at_commit(
    producers: ProducerFactory, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    txn_id = _txn_id()
    zombie = producers(txn_id)
    await zombie.start()
    await zombie.begin()
    await zombie.send(_requests(topic, "zombie", 2))
    leader = producers(txn_id)
    await leader.start()
    with pytest.raises(ProducerFencedError):
        await zombie.commit()
    await leader.begin()
    await leader.send(_requests(topic, "leader", 1))
    await leader.commit()
    got = consume(outboxkit_kafka_bootstrap, topic, expect=1, quiet=1.0)
    assert [r.value for r in got] == [b"leader-0"]


async def test_a_fenced_producer_sending_gets_producer_fenced_not_a_record_error(
    kafka: KafkaClients,
    producers: ProducerFactory,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The zombie of a randomized fault run: fenced while its batch is in flight. librdkafka
    reports it as a fatal error in the middle of the delivery callbacks, and logs it at its
    most severe level: kept as an ERROR, as the relay handles it (the zombie stands down), so
    it does not page whoever alerts on CRITICAL."""
    caplog.set_level(logging.DEBUG)
    topic = outboxkit_topic()
    txn_id = _txn_id()
    zombie = producers(txn_id)
    await zombie.start()
    await zombie.begin()
    assert all(d.error is None for d in await zombie.send(_requests(topic, "early", 1)))
    leader = producers(txn_id)
    await leader.start()
    with pytest.raises(ProducerFencedError):
        await zombie.send(_requests(topic, "zombie", 5))
    with pytest.raises(ProducerFencedError):
        await zombie.commit()
    await leader.begin()
    await leader.send(_requests(topic, "leader", 1))
    await leader.commit()
    got = consume(outboxkit_kafka_bootstrap, topic, expect=1, quiet=1.0)
    assert [r.value for r in got] == [b"leader-0"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.CRITICAL] == []
    if kafka.client is KafkaClient.CONFLUENT:
        fatal = [r for r in caplog.records if r.getMessage().startswith("FATAL [")]
        assert fatal
        assert {r.levelno for r in fatal} == {logging.ERROR}


async def test_unknown_topic_is_a_permanent_problem(
    producers: ProducerFactory, outboxkit_topic: TopicFactory
) -> None:
    producer = producers()
    await producer.start()
    assert await producer.topic_problem(outboxkit_topic()) is None
    problem = await producer.topic_problem(f"missing-{uuid.uuid4().hex}")
    assert problem is not None
    assert problem.kind is ErrorKind.PERMANENT


def _counted_admins(monkeypatch: pytest.MonkeyPatch) -> tuple[list[Admin], list[Admin]]:
    """The admins the producers make (real ones), and those closed."""
    made: list[Admin] = []
    closed: list[Admin] = []
    for module, name in (
        (confluent_producer, "ConfluentAdmin"),
        (aiokafka_producer, "AiokafkaAdmin"),
    ):
        real: Any = getattr(module, name)

        class Counted(real):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                made.append(self)

            async def close(self) -> None:
                closed.append(self)
                await super().close()

        monkeypatch.setattr(module, name, Counted)
    return made, closed


async def test_topic_limits_say_what_the_topics_configuration_refuses(
    producers: ProducerFactory, outboxkit_topic: TopicFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay reads them once per topic and producer life, before sending (broker_limits),
    on one admin client made for the life and closed with the producer; the producer's own
    largest batch and record say which topics' limits are below them."""
    made, closed = _counted_admins(monkeypatch)
    tight = outboxkit_topic(config={"max.message.bytes": "200000"})
    compacted = outboxkit_topic(config={"cleanup.policy": "compact"})
    producer = producers()
    await producer.start()
    assert producer.largest_record >= 1_000_000  # each client's default limits
    assert producer.largest_batch <= producer.largest_record
    limits = await producer.topic_limits(tight)
    assert limits == TopicLimits(200_000, "delete")
    assert not limits.compacted
    limits = await producer.topic_limits(compacted)
    assert limits.compacted
    assert limits.max_message_bytes is not None
    assert limits.max_message_bytes >= producer.largest_record  # the broker's default: not tight
    with pytest.raises(PublishError):
        await producer.topic_limits(f"missing-{uuid.uuid4().hex}")
    assert len(made) == 1  # one admin for every read of the life
    assert limits == await producer.topic_limits(compacted)  # the failed read left it usable
    assert closed == []
    await producer.close()
    assert closed == made


@pytest.mark.parametrize("transactional", [False, True])
async def test_oversized_record_is_a_permanent_error(
    producers: ProducerFactory, outboxkit_topic: TopicFactory, transactional: bool
) -> None:
    topic = outboxkit_topic(config={"max.message.bytes": "4000"})
    producer = producers(_txn_id() if transactional else None)
    await producer.start()
    if transactional:
        await producer.begin()
    (delivery,) = await producer.send([ProduceRequest(topic, b"k", b"x" * 6000)])
    assert delivery.error is not None
    assert delivery.error.kind is ErrorKind.PERMANENT, delivery.error
    if transactional:
        await producer.abort()


async def test_both_clients_map_a_key_to_the_same_partition(
    outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic(partitions=6)
    partitions = {}
    for client in KAFKA_CLIENTS:
        producer = _clients(outboxkit_kafka_bootstrap, client).transactional_producer(None)
        await producer.start()
        try:
            deliveries = await producer.send(
                [ProduceRequest(topic, f"key-{n}".encode(), b"v") for n in range(12)]
            )
        finally:
            await producer.close()
        partitions[client] = [d.partition for d in deliveries]
    assert partitions["confluent"] == partitions["aiokafka"]
    assert len(set(partitions["confluent"])) > 1


async def test_librdkafka_log_lines_go_to_python_logging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing listens on port 1: librdkafka logs the refused connection, served by poll/flush."""
    kafka = _clients("127.0.0.1:1", "confluent")
    producer = kafka.transactional_producer(None, **{"message.timeout.ms": 1500})
    await producer.start()
    caplog.set_level(logging.DEBUG, logger=LIBRDKAFKA_LOGGER.name)
    try:
        (delivery,) = await producer.send([ProduceRequest("t", b"k", b"v")])
    finally:
        await producer.close()
    assert delivery.error is not None  # timed out: nothing to deliver to
    lines = [r for r in caplog.records if r.name == LIBRDKAFKA_LOGGER.name]
    assert any("127.0.0.1:1" in r.getMessage() for r in lines), [r.getMessage() for r in lines]


# ------------------------------------------------------------------------------ admin


async def test_admin_describes_creates_and_reads_topic_configuration(
    kafka: KafkaClients, outboxkit_topic: TopicFactory
) -> None:
    admin = kafka.admin()
    try:
        existing = outboxkit_topic(partitions=3)
        found = await admin.describe_topic(existing)
        assert found is not None
        assert (found.name, found.partitions) == (existing, 3)
        missing = f"missing-{uuid.uuid4().hex}"
        assert await admin.describe_topic(missing) is None
        assert await admin.describe_topic(missing) is None  # a look-up created nothing
        created = f"created-{uuid.uuid4().hex}"
        config = {"cleanup.policy": "compact", "segment.ms": "600000"}
        await admin.create_topic(created, 2, config)
        await admin.create_topic(created, 2, config)  # already there: not an error
        # Creation is asynchronous in Kafka: a loaded broker may not list the topic at once.
        deadline = time.monotonic() + 30
        info = await admin.describe_topic(created)
        while info is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            info = await admin.describe_topic(created)
        assert info is not None
        assert info.partitions == 2
        assert await admin.topic_config(created, "cleanup.policy") == "compact"
        assert await admin.topic_config(created, "segment.ms") == "600000"
        # Several settings in one request; a name the broker does not know has no value.
        names = ("cleanup.policy", "segment.ms", "no.such.setting")
        assert await admin.topic_configs(created, names) == {
            "cleanup.policy": "compact",
            "segment.ms": "600000",
            "no.such.setting": None,
        }
        retention = await admin.topic_config(existing, "retention.ms")  # the broker default
        assert retention is not None
        assert int(retention) > 0
        with pytest.raises(PermanentPublishError):
            await admin.topic_config(missing, "retention.ms")
        with pytest.raises(PermanentPublishError):
            await admin.topic_configs(missing, names)
    finally:
        await admin.close()


# ------------------------------------------------------------------------------ checkpoint reader


async def test_checkpoint_reader_returns_the_last_committed_value_of_a_key(
    kafka: KafkaClients, producers: ProducerFactory, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic(partitions=2)
    reader = kafka.checkpoint_reader()
    try:
        assert await reader.last_committed(topic, 0, b"g/0") is None  # empty partition
        writer = producers(_txn_id())
        await writer.start()
        for key, value, commit in (
            (b"g/0", b"first", True),
            (b"g/1", b"other key", True),
            (b"g/0", b"second", True),
            (b"g/0", b"aborted", False),
        ):
            await writer.begin()
            await writer.send([ProduceRequest(topic, key, value, partition=0)])
            await (writer.commit() if commit else writer.abort())
        assert await reader.last_committed(topic, 0, b"g/0") == b"second"
        assert await reader.last_committed(topic, 0, b"g/1") == b"other key"
        assert await reader.last_committed(topic, 1, b"g/0") is None  # another partition
        # Several keys in one pass: each one's last value, a key not there left out.
        keys = (b"g/0", b"g/1", b"g/2")
        assert await reader.last_values(topic, 0, keys) == {b"g/0": b"second", b"g/1": b"other key"}
        # A transaction still open (another shard's, say) is waited for, never read.
        other = producers(_txn_id())
        await other.start()
        await other.begin()
        await other.send([ProduceRequest(topic, b"g/0", b"open", partition=0)])
        with pytest.raises(PublishError, match="transaction still open"):
            await _impatient(kafka).last_committed(topic, 0, b"g/0")
        await other.abort()
        assert await reader.last_committed(topic, 0, b"g/0") == b"second"
    finally:
        await reader.close()


def _impatient(kafka: KafkaClients) -> CheckpointReader:
    """A reader that gives up after 3 s (the fixture's waits 15 s)."""
    return KafkaClients(kafka.settings, timeout=3).checkpoint_reader()


async def test_checkpoint_reader_finds_a_commit_made_after_another_transaction_began(
    kafka: KafkaClients, producers: ProducerFactory, outboxkit_topic: TopicFactory
) -> None:
    """Another producer's transaction (another relay group's, or a dead relay's not yet aborted)
    opened on the partition before this shard's last commit: that commit lies beyond the last
    stable offset, and a read that stopped there would return the older checkpoint (and the
    rows of the newer would be published again)."""
    topic = outboxkit_topic(partitions=1)
    writer, other = producers(_txn_id()), producers(_txn_id())
    await writer.start()
    await other.start()
    await writer.begin()
    await writer.send([ProduceRequest(topic, b"g/0", b"older", partition=0)])
    await writer.commit()
    await other.begin()
    await other.send([ProduceRequest(topic, b"h/0", b"open", partition=0)])
    await writer.begin()
    await writer.send([ProduceRequest(topic, b"g/0", b"newer", partition=0)])
    await writer.commit()
    with pytest.raises(PublishError, match="transaction still open"):
        await _impatient(kafka).last_committed(topic, 0, b"g/0")  # never b"older"
    reader = kafka.checkpoint_reader()
    try:
        finished = asyncio.create_task(reader.last_committed(topic, 0, b"g/0"))
        await other.commit()
        assert await finished == b"newer"
        assert await reader.last_committed(topic, 0, b"h/0") == b"open"
    finally:
        await reader.close()
