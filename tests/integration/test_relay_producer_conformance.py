"""One contract, two implementations: confluent-kafka and aiokafka pass the same tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from outboxkit.errors import ProducerFencedError
from outboxkit.relay.producer.aiokafka import AiokafkaProducer
from outboxkit.relay.producer.base import ProduceRequest, RelayProducer
from outboxkit.relay.producer.confluent import ConfluentProducer
from outboxkit.relay.producer.errors import ErrorKind
from tests.relay_support import consume

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
IMPLEMENTATIONS = {"confluent": ConfluentProducer, "aiokafka": AiokafkaProducer}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def make(
    request: pytest.FixtureRequest, outboxkit_kafka_bootstrap: str
) -> AsyncIterator[Callable[..., RelayProducer]]:
    cls = IMPLEMENTATIONS[request.param]

    def factory(transactional_id: str | None = None) -> RelayProducer:
        producer = cls(outboxkit_kafka_bootstrap, transactional_id=transactional_id, timeout=15)
        created.append(producer)
        return producer

    created: list[RelayProducer] = []

    async def lifecycle() -> AsyncIterator[Callable[..., RelayProducer]]:
        try:
            yield factory
        finally:
            for producer in created:
                await producer.close()

    return lifecycle()


@pytest.fixture
async def producer_factory(
    make: AsyncIterator[Callable[..., RelayProducer]],
) -> AsyncIterator[Callable[..., RelayProducer]]:
    factory = await make.__anext__()
    try:
        yield factory
    finally:
        with pytest.raises(StopAsyncIteration):
            await make.__anext__()


def _requests(topic: str, key: str, count: int) -> list[ProduceRequest]:
    return [
        ProduceRequest(topic, key.encode(), f"{key}-{n}".encode(), [("event-id", f"{n}".encode())])
        for n in range(count)
    ]


async def test_idempotent_send_acknowledges_in_order_with_headers(
    producer_factory: Callable[..., RelayProducer],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic(partitions=3)
    producer = producer_factory()
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


async def test_transaction_commit_is_visible_and_abort_is_not(
    producer_factory: Callable[..., RelayProducer],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    producer = producer_factory(f"conf-{uuid.uuid4().hex}")
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


async def test_a_newer_producer_with_the_same_transactional_id_fences_the_old(
    producer_factory: Callable[..., RelayProducer],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    txn_id = f"conf-fence-{uuid.uuid4().hex}"
    zombie = producer_factory(txn_id)
    await zombie.start()
    await zombie.begin()
    await zombie.send(_requests(topic, "zombie", 2))
    leader = producer_factory(txn_id)
    await leader.start()
    with pytest.raises(ProducerFencedError):
        await zombie.commit()
    await leader.begin()
    await leader.send(_requests(topic, "leader", 1))
    await leader.commit()
    got = consume(outboxkit_kafka_bootstrap, topic, expect=1, quiet=1.0)
    assert [r.value for r in got] == [b"leader-0"]


async def test_unknown_topic_is_a_permanent_problem(
    producer_factory: Callable[..., RelayProducer], outboxkit_topic: TopicFactory
) -> None:
    producer = producer_factory()
    await producer.start()
    assert await producer.topic_problem(outboxkit_topic()) is None
    problem = await producer.topic_problem(f"missing-{uuid.uuid4().hex}")
    assert problem is not None
    assert problem.kind is ErrorKind.PERMANENT


@pytest.mark.parametrize("transactional", [False, True])
async def test_oversized_record_is_a_permanent_error(
    producer_factory: Callable[..., RelayProducer],
    outboxkit_topic: TopicFactory,
    transactional: bool,
) -> None:
    topic = outboxkit_topic(config={"max.message.bytes": "4000"})
    producer = producer_factory(f"conf-big-{uuid.uuid4().hex}" if transactional else None)
    await producer.start()
    if transactional:
        await producer.begin()
    (delivery,) = await producer.send([ProduceRequest(topic, b"k", b"x" * 6000)])
    assert delivery.error is not None
    assert delivery.error.kind is ErrorKind.PERMANENT, delivery.error
    if transactional:
        await producer.abort()


async def test_both_implementations_map_a_key_to_the_same_partition(
    outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic(partitions=6)
    partitions = {}
    for name, cls in IMPLEMENTATIONS.items():
        producer = cls(outboxkit_kafka_bootstrap, transactional_id=None, timeout=15)
        await producer.start()
        try:
            deliveries = await producer.send(
                [ProduceRequest(topic, f"key-{n}".encode(), b"v") for n in range(12)]
            )
        finally:
            await producer.close()
        partitions[name] = [d.partition for d in deliveries]
    assert partitions["confluent"] == partitions["aiokafka"]
    assert len(set(partitions["confluent"])) > 1
