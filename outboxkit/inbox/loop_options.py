"""What one consumer loop is given: its topics, its dead-letter and acks topics, its batches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from outboxkit.inbox.deadletter import (
    DEAD_LETTER_MAX_BYTES,
    DEFAULT_DEAD_LETTER_TOPIC,
    DeadLetterCheck,
    DeadLetterTopic,
)

if TYPE_CHECKING:
    from outboxkit.inbox.metrics import InboxMetrics
    from outboxkit.inbox.retention import Retention

# An unexpected error around a delivery (database down, a value the database refuses, a bug):
# the partition is held and the delivery retried after this long, at most
# ``max_unexpected_errors`` times in a row before it is given up (recorded, offset advanced).
ERROR_RETRY_SECONDS = 1.0
# Batched processing: at most this many records per transaction (each handler in a savepoint;
# PostgreSQL keeps 64 subtransactions per transaction in shared memory, more slow every
# snapshot), and at most this long spent topping a batch up after its first record.
BATCH_MAX_RECORDS = 50
BATCH_MAX_MS = 5.0


@dataclass(frozen=True)
class LoopOptions:
    topics: list[str]
    dead_letter: DeadLetterTopic | None = DEFAULT_DEAD_LETTER_TOPIC
    acks_topic: str | None = None
    offset_commit_interval: float = 0.0
    poll_timeout: float = 0.5
    max_records: int = 100
    metrics: InboxMetrics | None = None
    max_unexpected_errors: int = 5
    dead_letter_max_bytes: int = DEAD_LETTER_MAX_BYTES
    retention: Retention | None = None
    dead_letter_check: DeadLetterCheck = "fail"
    batch_max_records: int = BATCH_MAX_RECORDS
    batch_max_ms: float = BATCH_MAX_MS
    offset_reset: str = "earliest"  # the client's auto.offset.reset (GroupConsumer.offset_reset)
