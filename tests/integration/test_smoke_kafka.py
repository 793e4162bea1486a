"""The self-started broker supports what the relay needs: idempotence, transactions, fencing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

TopicFactory = Callable[..., str]


def _consume_all(bootstrap: str, topic: str, *, expect: int, timeout: float = 20.0) -> list[bytes]:
    """Read with ``read_committed`` until ``expect`` values arrived and 1 s more passed quietly."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"smoke-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                values.append(msg.value())
                quiet_until = None
            if len(values) >= expect:
                quiet_until = quiet_until or time.monotonic() + 1.0
                if time.monotonic() > quiet_until:
                    break
    finally:
        consumer.close()
    return values


def test_confluent_idempotent_produce_consume(
    outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    producer = Producer(
        {"bootstrap.servers": outboxkit_kafka_bootstrap, "enable.idempotence": True, "acks": "all"}
    )
    for i in range(5):
        producer.produce(topic, f"m{i}".encode(), key=b"k")
    assert producer.flush(10) == 0
    assert _consume_all(outboxkit_kafka_bootstrap, topic, expect=5) == [
        f"m{i}".encode() for i in range(5)
    ]


async def test_aiokafka_idempotent_produce_consume(
    outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    producer = AIOKafkaProducer(
        bootstrap_servers=outboxkit_kafka_bootstrap, enable_idempotence=True, acks="all"
    )
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait(topic, f"a{i}".encode(), key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=outboxkit_kafka_bootstrap,
        group_id=f"smoke-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                got.extend(m.value for m in messages)
    finally:
        await consumer.stop()
    assert got == [f"a{i}".encode() for i in range(5)]


def test_transactions_commit_and_abort(
    outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic(partitions=2)
    producer = Producer(
        {
            "bootstrap.servers": outboxkit_kafka_bootstrap,
            "transactional.id": f"smoke-{uuid.uuid4().hex}",
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed", key=b"k")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted", key=b"k")
    producer.flush(10)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed-2", key=b"k")
    producer.commit_transaction(30)
    assert _consume_all(outboxkit_kafka_bootstrap, topic, expect=2) == [
        b"committed",
        b"committed-2",
    ]


async def test_aiokafka_transaction_abort_invisible(
    outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    producer = AIOKafkaProducer(
        bootstrap_servers=outboxkit_kafka_bootstrap, transactional_id=f"smoke-{uuid.uuid4().hex}"
    )
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"kept", key=b"k")
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"dropped", key=b"k")
        await producer.abort_transaction()
    finally:
        await producer.stop()
    assert _consume_all(outboxkit_kafka_bootstrap, topic, expect=1) == [b"kept"]


def test_same_transactional_id_fences_the_first_producer(
    outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    txn_id = f"smoke-fence-{uuid.uuid4().hex}"
    first = Producer({"bootstrap.servers": outboxkit_kafka_bootstrap, "transactional.id": txn_id})
    first.init_transactions(30)
    first.begin_transaction()
    first.produce(topic, b"zombie", key=b"k")
    first.flush(10)

    second = Producer({"bootstrap.servers": outboxkit_kafka_bootstrap, "transactional.id": txn_id})
    second.init_transactions(60)
    with pytest.raises(KafkaException) as caught:
        first.commit_transaction(30)
    error = caught.value.args[0]
    assert error.code() == KafkaError._FENCED
    assert error.fatal()

    second.begin_transaction()
    second.produce(topic, b"leader", key=b"k")
    second.commit_transaction(30)
    assert _consume_all(outboxkit_kafka_bootstrap, topic, expect=1) == [b"leader"]
