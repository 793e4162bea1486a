"""A partition's log start and end from confluent-kafka, asked of the broker.

The inbox asks before it seeks back to a record held for a retry: an end at or below the held
offset means the log the hold refers to was replaced (a topic deleted and created again), which
no cached value (``cached=True`` reports what was last fetched) could tell.

librdkafka's ``get_watermark_offsets`` does not keep to its timeout while a synchronous offset
commit waits for an answer that does not come (its broker stopped answering: held for minutes
on the real stack, ``tests/fault/test_confluent_commit_unanswered.py``; an asynchronous commit
in flight did not hold it), so it runs in a thread of its own, given :data:`MARGIN_SECONDS` past
its timeout: past them, :class:`Unanswered` (the caller gives the client up, as after an
unanswered commit).
"""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaException, TopicPartition

from outboxkit.bounded import Unanswered, call_within
from outboxkit.errors import PublishError
from outboxkit.kafka.api import TopicPartition as TP

#: How long past its own timeout the read may take before the client is given up.
MARGIN_SECONDS = 2.0


def log_bounds(consumer: Consumer, partition: TP, timeout: float) -> tuple[int, int]:
    """``(start, end)`` of ``partition``'s log; ``PublishError`` if not read in ``timeout``,
    :class:`Unanswered` if the call still waits :data:`MARGIN_SECONDS` later."""

    def read() -> tuple[int, int] | None:
        return consumer.get_watermark_offsets(TopicPartition(*partition), timeout, False)

    try:
        found = call_within(read, timeout + MARGIN_SECONDS, "outboxkit-log-bounds")
    except (KafkaException, RuntimeError) as exc:  # RuntimeError: the client is closed
        raise PublishError(f"reading the log's bounds failed: {exc.args[0]}") from exc
    if found is None:
        raise PublishError(f"reading the log's bounds failed: no answer within {timeout:g} s")
    low, high = found
    return int(low), int(high)


__all__ = ["MARGIN_SECONDS", "Unanswered", "log_bounds"]
