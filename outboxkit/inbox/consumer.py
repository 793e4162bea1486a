"""What both consumer adapters are built from: an inbox, the Kafka settings and the loop options.

The adapters (:mod:`outboxkit.inbox.confluent`, :mod:`outboxkit.inbox.aiokafka`) only choose
the driver (sync or async) and the client pair; everything they decide is in
:class:`~outboxkit.inbox.loop.ConsumerLoop`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from outboxkit.bounds import check_range
from outboxkit.errors import ConfigurationError
from outboxkit.inbox.deadletter import (
    DEAD_LETTER_MAX_BYTES,
    DEFAULT_DEAD_LETTER_TOPIC,
    DeadLetterCheck,
    DeadLetterTopic,
    check_dead_letter_topic,
)
from outboxkit.inbox.kafka_steps import StopEvent, kafka_steps
from outboxkit.inbox.loop import ConsumerLoop
from outboxkit.inbox.loop_options import BATCH_MAX_MS, BATCH_MAX_RECORDS, LoopOptions
from outboxkit.inbox.middleware import AsyncInbox, Inbox
from outboxkit.inbox.retention import Retention
from outboxkit.inbox.steps import Executor
from outboxkit.kafka import KafkaClients
from outboxkit.kafka.api import AsyncGroupConsumer, AsyncRecordSender, GroupConsumer, RecordSender
from outboxkit.limits import MESSAGE_MAX_BYTES_RANGE
from outboxkit.settings import KafkaSettings
from outboxkit.settings.kafka_only import load_kafka_settings
from outboxkit.settings.models import DAY, MAX_BATCH_MS, MAX_BATCH_RECORDS

if TYPE_CHECKING:
    from outboxkit.inbox.metrics import InboxMetrics

InboxT = TypeVar("InboxT", Inbox, AsyncInbox)
Clients = tuple[GroupConsumer | AsyncGroupConsumer, RecordSender | AsyncRecordSender]
#: confluent-kafka's consume() takes at most this many records (more: ValueError at every poll).
MAX_POLL_RECORDS = 1_000_000


def check_options(
    *,
    offset_commit_interval: float,
    poll_timeout: float,
    max_records: int,
    max_unexpected_errors: int,
    dead_letter_max_bytes: int,
    batch_max_records: int,
    batch_max_ms: float,
) -> tuple[float, float, float]:
    """Refuse what would stall or crash the loop later. A poll timeout that is negative waits
    forever in confluent-kafka (SIGTERM unheard while idle), NaN or 0 spins, and aiokafka
    raises on NaN at every poll; an infinite commit interval commits only on revoke and close;
    a NaN ``max_unexpected_errors`` never gives a poison record up, a NaN
    ``batch_max_records`` takes no record at all; a dead-letter limit above what any producer
    accepts loses the dead-letter record instead of trimming it. Returns
    ``offset_commit_interval``, ``poll_timeout`` and ``batch_max_ms`` to keep (a ``Decimal``
    as a float: :func:`~outboxkit.bounds.check_range`)."""
    name = "InboxConsumer."
    interval = check_range(name + "offset_commit_interval", offset_commit_interval, 0, DAY)
    timeout = check_range(name + "poll_timeout", poll_timeout, 0, DAY, above=True)
    check_range(name + "max_records", max_records, 1, MAX_POLL_RECORDS, integer=True)
    check_range(name + "max_unexpected_errors", max_unexpected_errors, 1, integer=True)
    low, high = MESSAGE_MAX_BYTES_RANGE
    check_range(name + "dead_letter_max_bytes", dead_letter_max_bytes, low, high, integer=True)
    check_range(name + "batch_max_records", batch_max_records, 1, MAX_BATCH_RECORDS, integer=True)
    batch_ms = check_range(name + "batch_max_ms", batch_max_ms, 0, MAX_BATCH_MS)
    return interval, timeout, batch_ms


def check_poll_timeout(timeout: float | None, name: str = "timeout") -> float | None:
    """A call's own timeout (seconds, at most a day) to use: 0 polls without waiting; a
    negative one would wait forever in confluent-kafka."""
    return None if timeout is None else check_range(name, timeout, 0, DAY)


def stopped_by(stop: Any) -> Callable[[], bool]:
    """``stop.is_set`` of a ``threading.Event`` or an ``asyncio.Event`` (or never)."""
    if stop is None:
        return lambda: False
    is_set: Callable[[], bool] = stop.is_set
    return is_set


class InboxConsumer(Generic[InboxT]):
    """Consume ``topics`` as group ``group_id`` and run each record through ``inbox``.

    ``kafka`` defaults to the ``[kafka]`` settings from every source (the TOML file named by
    ``OUTBOXKIT_CONFIG``, ``OUTBOXKIT_KAFKA_*`` variables, files in ``OUTBOXKIT_SECRETS_DIR``:
    :func:`~outboxkit.settings.kafka_only.load_kafka_settings`); ``config``
    holds extra consumer properties in the client's own spelling (e.g. ``session.timeout.ms``
    for confluent-kafka, ``session_timeout_ms`` for aiokafka).

    ``dead_letter``: a topic name, a template whose only placeholder is ``{topic}`` (anything
    else is a :class:`~outboxkit.errors.ConfigurationError` here), or a callable of the topic.
    ``dead_letter_check``: at start-up, a missing dead-letter or acks topic is an error
    (``"fail"``), a warning (``"warn"``) or not looked for (``"off"``). ``retention`` purges
    finished inbox rows and old rejections from this loop. ``max_unexpected_errors``: failures
    outside the handler of one record in a row before it is given up (recorded as a rejection).
    ``batch_max_records``: records processed in one transaction (a savepoint per handler only
    after a failure; 1: one transaction per record); ``batch_max_ms``: how long a batch waits
    to fill up after its first record.

    ``stop``: an event (``threading.Event`` for the confluent-kafka consumer, ``asyncio.Event``
    for aiokafka) that also ends the start-up's waits for Kafka (the topic check retries while
    Kafka is away, and ``async with``/``with`` would otherwise not return until it answers);
    ``run()`` uses it when given none.

    Bounds (an :class:`~outboxkit.errors.OutOfRangeError`, a ``ValueError`` too, names the
    argument): ``offset_commit_interval`` 0 to a day,
    ``poll_timeout`` above 0 and at most a day (seconds), ``max_records`` 1 to 1,000,000,
    ``max_unexpected_errors`` at least 1, ``dead_letter_max_bytes`` 1000 to 1,000,000,000
    (librdkafka's range of ``message.max.bytes``), ``batch_max_records`` 1 to 64,
    ``batch_max_ms`` 0 to 60,000; every number finite.
    """

    _stop: StopEvent | None = None  # the running run()'s: a back-off ends when it is set
    _stop_type: type = object  # the event type its driver waits on (set by each adapter)
    _stop_name = "threading.Event or asyncio.Event"

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
        stop: StopEvent | None = None,
    ) -> None:
        offset_commit_interval, poll_timeout, batch_max_ms = check_options(
            offset_commit_interval=offset_commit_interval,
            poll_timeout=poll_timeout,
            max_records=max_records,
            max_unexpected_errors=max_unexpected_errors,
            dead_letter_max_bytes=dead_letter_max_bytes,
            batch_max_records=batch_max_records,
            batch_max_ms=batch_max_ms,
        )
        check_dead_letter_topic(dead_letter)
        if stop is not None and not isinstance(stop, self._stop_type):
            raise ConfigurationError(  # never set as far as this consumer could see
                f"stop= of {type(self).__name__} must be a {self._stop_name}"
            )
        self.inbox: InboxT = inbox
        self.stop_event = stop
        self.group_id = group_id
        clients = KafkaClients(kafka if kafka is not None else load_kafka_settings())
        consumer, sender = self._clients(clients, group_id, dict(config or {}))
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
                offset_reset=consumer.offset_reset,
            ),
        )
        self.executor: Executor = inbox.executor(kafka_steps(consumer, sender, self._stopping))

    def _stopping(self) -> StopEvent | None:
        """What ends a back-off: the running ``run()``'s event, else the one given at start."""
        return self._stop if self._stop is not None else self.stop_event

    def _clients(self, clients: KafkaClients, group_id: str, config: dict[str, Any]) -> Clients:
        raise NotImplementedError
