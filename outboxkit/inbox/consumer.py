"""What both consumer adapters are built from: an inbox, the Kafka settings and the loop options.

The adapters (:mod:`outboxkit.inbox.confluent`, :mod:`outboxkit.inbox.aiokafka`) only choose
the driver (sync or async) and the client pair; everything they decide is in
:class:`~outboxkit.inbox.loop.ConsumerLoop`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from outboxkit.inbox.deadletter import (
    DEAD_LETTER_MAX_BYTES,
    DEFAULT_DEAD_LETTER_TOPIC,
    DeadLetterCheck,
    DeadLetterTopic,
    check_dead_letter_topic,
)
from outboxkit.inbox.kafka_steps import kafka_steps
from outboxkit.inbox.loop import (
    BATCH_MAX_MS,
    BATCH_MAX_RECORDS,
    ConsumerLoop,
    LoopOptions,
)
from outboxkit.inbox.middleware import AsyncInbox, Inbox
from outboxkit.inbox.retention import Retention
from outboxkit.inbox.steps import Executor
from outboxkit.kafka import KafkaClients
from outboxkit.kafka.api import AsyncGroupConsumer, AsyncRecordSender, GroupConsumer, RecordSender
from outboxkit.settings import KafkaSettings
from outboxkit.settings.models import MAX_BATCH_MS

if TYPE_CHECKING:
    from outboxkit.inbox.metrics import InboxMetrics

InboxT = TypeVar("InboxT", Inbox, AsyncInbox)
Clients = tuple[GroupConsumer | AsyncGroupConsumer, RecordSender | AsyncRecordSender]


def stopped_by(stop: Any) -> Callable[[], bool]:
    """``stop.is_set`` of a ``threading.Event`` or an ``asyncio.Event`` (or never)."""
    if stop is None:
        return lambda: False
    is_set: Callable[[], bool] = stop.is_set
    return is_set


class InboxConsumer(Generic[InboxT]):
    """Consume ``topics`` as group ``group_id`` and run each record through ``inbox``.

    ``kafka`` defaults to ``KafkaSettings()`` (the ``OUTBOXKIT_KAFKA_*`` variables); ``config``
    holds extra consumer properties in the client's own spelling (e.g. ``session.timeout.ms``
    for confluent-kafka, ``session_timeout_ms`` for aiokafka).

    ``dead_letter``: a topic name, a template whose only placeholder is ``{topic}`` (anything
    else is a :class:`~outboxkit.errors.ConfigurationError` here), or a callable of the topic.
    ``dead_letter_check``: at start-up, a missing dead-letter topic is an error (``"fail"``), a
    warning (``"warn"``) or not looked for (``"off"``). ``retention`` purges finished inbox rows
    and old rejections from this loop. ``max_unexpected_errors``: failures outside the handler
    of one record in a row before it is given up (recorded as a rejection).
    ``batch_max_records``: records processed in one transaction (a savepoint per handler only
    after a failure; 1: one transaction per record); ``batch_max_ms``: how long a batch waits
    to fill up after its first record.
    """

    def __init__(
        self,
        inbox: InboxT,
        kafka: KafkaSettings | None = None,
        *,
        group_id: str,
        topics: list[str],
        config: Mapping[str, Any] | None = None,
        dead_letter: DeadLetterTopic | None = DEFAULT_DEAD_LETTER_TOPIC,
        acks_topic: str | None = None,
        offset_commit_interval: float = 0.0,
        metrics: InboxMetrics | None = None,
        poll_timeout: float = 0.5,
        max_records: int = 100,
        dead_letter_check: DeadLetterCheck = "fail",
        retention: Retention | None = None,
        max_unexpected_errors: int = 5,
        dead_letter_max_bytes: int = DEAD_LETTER_MAX_BYTES,
        batch_max_records: int = BATCH_MAX_RECORDS,
        batch_max_ms: float = BATCH_MAX_MS,
    ) -> None:
        if max_unexpected_errors < 1:
            raise ValueError("max_unexpected_errors must be at least 1")
        if batch_max_records < 1 or not 0 <= batch_max_ms <= MAX_BATCH_MS:  # refuses nan too
            raise ValueError(
                "batch_max_records must be at least 1,"
                f" batch_max_ms between 0 and {MAX_BATCH_MS:.0f}"
            )
        check_dead_letter_topic(dead_letter)
        self.inbox: InboxT = inbox
        self.group_id = group_id
        self.loop = ConsumerLoop(
            inbox.core,
            LoopOptions(
                topics=list(topics),
                dead_letter=dead_letter,
                acks_topic=acks_topic,
                offset_commit_interval=offset_commit_interval,
                poll_timeout=poll_timeout,
                max_records=max_records,
                metrics=metrics,
                max_unexpected_errors=max_unexpected_errors,
                dead_letter_max_bytes=dead_letter_max_bytes,
                retention=retention,
                dead_letter_check=dead_letter_check,
                batch_max_records=batch_max_records,
                batch_max_ms=batch_max_ms,
            ),
        )
        clients = KafkaClients(kafka if kafka is not None else KafkaSettings())
        consumer, sender = self._clients(clients, group_id, dict(config or {}))
        self.executor: Executor = inbox.executor(kafka_steps(consumer, sender))

    def _clients(self, clients: KafkaClients, group_id: str, config: dict[str, Any]) -> Clients:
        raise NotImplementedError
