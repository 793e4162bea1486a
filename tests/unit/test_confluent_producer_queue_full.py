"""A record larger than the confluent producer's queue never hangs send().

librdkafka's produce() raises BufferError for a record that does not fit into the queue, even an
empty one. The queue must take one record of the producer's ``message.max.bytes``; a record that
still does not fit (a queue set smaller in properties) is refused as a permanent record error,
so the relay parks it, and the wait for room is bounded by the producer's timeout.

The broker is unreachable: nothing is ever delivered, deliveries time out or are never asked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from outboxkit.errors import PublishError
from outboxkit.kafka.api import NOT_SENT, ProduceRequest
from outboxkit.kafka.errors import ErrorKind
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit

UNREACHABLE = "127.0.0.1:1"
MIB = 1024 * 1024
GUARD = 15.0  # seconds: before the fix send() never returned at all


@pytest.fixture(autouse=True)
def _quiet_librdkafka() -> Iterator[None]:
    """Connection refused, again and again: not worth a log line each."""
    logger = logging.getLogger("outboxkit.kafka.librdkafka")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


async def _send(
    requests: list[ProduceRequest],
    properties: dict[str, str],
    *,
    producer_timeout: float,
    **overrides: Any,
) -> Any:
    pytest.importorskip("confluent_kafka")
    from outboxkit.kafka.confluent_producer import ConfluentTransactionalProducer

    settings = KafkaSettings(bootstrap=UNREACHABLE, properties=properties)
    producer = ConfluentTransactionalProducer(
        settings, transactional_id=None, timeout=producer_timeout, max_queue_bytes=MIB, **overrides
    )
    await producer.start()
    try:
        return producer, await asyncio.wait_for(producer.send(requests), GUARD)
    finally:
        await producer.close()


async def test_a_record_within_message_max_bytes_fits_into_the_queue() -> None:
    """message.max.bytes raised to 10 MB, a 4 MiB record, a 1 MiB claim cap: the record is
    queued (its delivery then times out, the broker being unreachable), not refused, no hang."""
    big = ProduceRequest("t", b"k", b"x" * (4 * MIB))
    producer, deliveries = await _send(
        [big],
        {"message.max.bytes": "10000000"},
        producer_timeout=10.0,
        **{"message.timeout.ms": 500},  # the delivery times out well before send()'s deadline
    )
    assert producer._config["queue.buffering.max.kbytes"] >= 10_000_000 // 1024
    assert len(deliveries) == 1
    error = deliveries[0].error
    assert error is not None
    assert error.name == "_MSG_TIMED_OUT"  # queued and tried: the unreachable broker
    assert error.kind is ErrorKind.RETRIABLE


async def test_a_record_larger_than_the_whole_queue_is_refused_as_permanent() -> None:
    """A queue set smaller in properties than a record: refused, parked by the relay with the
    reason; the records after it are not sent."""
    big = ProduceRequest("t", b"k", b"x" * (4 * MIB))
    after = ProduceRequest("t", b"k", b"small")
    _, deliveries = await _send(
        [big, after],
        {"message.max.bytes": "10000000", "queue.buffering.max.kbytes": "1024"},
        producer_timeout=10.0,
    )
    assert len(deliveries) == 2
    refused = deliveries[0].error
    assert refused is not None
    assert refused.kind is ErrorKind.PERMANENT
    assert "larger than the producer's whole queue" in refused.message
    assert "queue.buffering.max.kbytes" in refused.message
    assert deliveries[1] == NOT_SENT


async def test_the_wait_for_room_in_the_queue_is_bounded_by_the_timeout() -> None:
    """A record of ours still pending (never timing out: message.timeout.ms 0) keeps the queue
    full for the next, too large one: send() gives up after its timeout."""
    small = ProduceRequest("t", b"k", b"small")
    big = ProduceRequest("t", b"k", b"x" * (2 * MIB))
    with pytest.raises(PublishError, match="not acknowledged in time"):
        await _send(
            [small, big],
            {"message.max.bytes": "10000000", "queue.buffering.max.kbytes": "1024"},
            producer_timeout=1.0,
            **{"message.timeout.ms": 0},
        )
