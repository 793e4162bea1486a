"""A partition's log start and end from confluent-kafka, asked of the broker.

The inbox asks before it seeks back to a record held for a retry: an end at or below the held
offset means the log the hold refers to was replaced (a topic deleted and created again), which
no cached value (``cached=True`` reports what was last fetched) could tell.
"""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaException, TopicPartition

from outboxkit.errors import PublishError
from outboxkit.kafka.api import TopicPartition as TP


def log_bounds(consumer: Consumer, partition: TP, timeout: float) -> tuple[int, int]:
    """``(start, end)`` of ``partition``'s log; ``PublishError`` if not read in ``timeout``."""
    try:
        found = consumer.get_watermark_offsets(TopicPartition(*partition), timeout, False)
    except (KafkaException, RuntimeError) as exc:  # RuntimeError: the client is closed
        raise PublishError(f"reading the log's bounds failed: {exc.args[0]}") from exc
    if found is None:
        raise PublishError(f"reading the log's bounds failed: no answer within {timeout:g} s")
    low, high = found
    return int(low), int(high)
