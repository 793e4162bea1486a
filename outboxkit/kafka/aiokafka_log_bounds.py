"""A partition's log start and end from aiokafka, asked of the broker (see
:mod:`outboxkit.kafka.confluent_log_bounds`), bounded: aiokafka may wait for ever on a
partition its metadata lacks."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from outboxkit.errors import PublishError, named
from outboxkit.kafka.api import TopicPartition as TP


async def log_bounds(consumer: AIOKafkaConsumer, partition: TP, wait: float) -> tuple[int, int]:
    """``(start, end)`` of ``partition``'s log (the end under the consumer's isolation level);
    ``PublishError`` if not read within ``wait`` seconds."""
    tp = TopicPartition(*partition)

    async def read() -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
        return await consumer.beginning_offsets([tp]), await consumer.end_offsets([tp])

    try:
        starts, stops = await asyncio.wait_for(read(), wait)
    except (KafkaError, TimeoutError, OSError) as exc:
        raise PublishError(f"reading the log's bounds failed: {named(exc)}") from exc
    return int(starts[tp]), int(stops[tp])
