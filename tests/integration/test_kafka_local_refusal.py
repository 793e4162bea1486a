"""Both clients on a real broker: a record above the producer's own limit is refused before it
is sent, under the broker's error name, with ``RecordError.local`` set (the relay then does not
read the topic's configuration again for it); one above only the topic's ``max.message.bytes``
is the broker's refusal, without it (read again)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from outboxkit.kafka import KafkaClients
from outboxkit.kafka.api import ProduceRequest, RecordError, TransactionalProducer
from outboxkit.relay.broker_limits import BrokerLimits
from outboxkit.settings import KafkaClient, KafkaSettings
from tests.relay_support import KAFKA_CLIENTS

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
ProducerFactory = Callable[..., TransactionalProducer]
MIB = 1024 * 1024
TOPIC_LIMIT = 4000  # far below both producers' own limit (about 1 MB)
SIZE_NAMES = {"confluent": "MSG_SIZE_TOO_LARGE", "aiokafka": "MessageSizeTooLargeError"}


@pytest.fixture(params=KAFKA_CLIENTS)
def client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def producers(
    client: str, outboxkit_kafka_bootstrap: str
) -> AsyncIterator[Callable[..., TransactionalProducer]]:
    created: list[TransactionalProducer] = []

    def make() -> TransactionalProducer:
        settings = KafkaSettings(bootstrap=outboxkit_kafka_bootstrap, client=KafkaClient(client))
        producer = KafkaClients(settings, timeout=15).transactional_producer(None)
        created.append(producer)
        return producer

    yield make
    for producer in created:
        await producer.close()


async def _refusal(producer: TransactionalProducer, topic: str, size: int) -> RecordError:
    await producer.start()
    (delivery,) = await producer.send([ProduceRequest(topic, b"k", b"x" * size)])
    assert delivery.error is not None
    return delivery.error


async def _read_again(producer: TransactionalProducer, topic: str, error: RecordError) -> bool:
    """Whether the relay's ``refused`` has the topic's configuration read at the next claim."""
    limits = BrokerLimits(0)
    await limits.learn(producer, topic)
    assert limits.unlearned([topic]) == []
    limits.refused([(topic, error)])
    return limits.unlearned([topic]) == [topic]


async def test_a_record_above_the_producers_own_limit_is_a_local_refusal(
    client: str, producers: ProducerFactory, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic(config={"max.message.bytes": str(2 * MIB)})  # the topic takes it
    producer = producers()
    assert producer.largest_record <= MIB
    error = await _refusal(producer, topic, MIB + 1)
    assert error.name == SIZE_NAMES[client]
    assert error.local
    assert not await _read_again(producer, topic, error)


async def test_a_record_above_only_the_topics_limit_is_the_brokers_refusal(
    client: str, producers: ProducerFactory, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic(config={"max.message.bytes": str(TOPIC_LIMIT)})
    producer = producers()
    error = await _refusal(producer, topic, 6000)
    assert error.name == SIZE_NAMES[client]
    assert not error.local
    assert await _read_again(producer, topic, error)


async def test_a_record_larger_than_the_confluent_queue_is_a_local_refusal(
    outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    """librdkafka's queue set smaller than a record it would send (``_larger_than_queue``);
    aiokafka has no such queue (its batches hold one send's records)."""
    topic = outboxkit_topic(config={"max.message.bytes": str(8 * MIB)})
    settings = KafkaSettings(
        bootstrap=outboxkit_kafka_bootstrap,
        client=KafkaClient.CONFLUENT,
        properties={"message.max.bytes": "10000000", "queue.buffering.max.kbytes": "1024"},
    )
    producer = KafkaClients(settings, timeout=15).transactional_producer(None)
    try:
        error = await _refusal(producer, topic, 4 * MIB)
    finally:
        await producer.close()
    assert error.name == "MSG_SIZE_TOO_LARGE"
    assert "larger than the producer's whole queue" in error.message
    assert error.local
