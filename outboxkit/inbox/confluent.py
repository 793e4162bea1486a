"""confluent-kafka adapter: a ``Consumer`` loop driving the sync :class:`Inbox`.

The consumer runs with ``isolation.level=read_committed``, auto-commit and auto offset store
off; an offset is committed (synchronously) only after the handler's transaction committed, or
after the event was recorded as duplicate/rejected/dead/cancelled. With ``offset_commit_interval``
the settled offsets are committed every that many seconds instead (and on revoke and close):
fewer round trips, and still safe, because a redelivery of a settled event is recognised. A
failed handler pauses its partition and seeks back (see :mod:`outboxkit.inbox.gate`): the
member stays in the group.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from outboxkit.errors import PublishError
from outboxkit.inbox.acks import ack_record
from outboxkit.inbox.deadletter import (
    DEFAULT_DEAD_LETTER_TOPIC,
    DeadLetterTopic,
    dead_letter_headers,
    dead_letter_topic,
)
from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.gate import PartitionGate
from outboxkit.inbox.middleware import Inbox
from outboxkit.inbox.offsets import PendingOffsets
from outboxkit.inbox.outcome import Outcome, OutcomeKind

if TYPE_CHECKING:
    from outboxkit.inbox.metrics import InboxMetrics

logger = logging.getLogger("outboxkit.inbox.confluent")

_FORCED = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "isolation.level": "read_committed",
}
_ERROR_RETRY_SECONDS = 1.0


class ConfluentInboxConsumer:
    """Consume ``topics`` as group ``group_id`` and run each message through ``inbox``."""

    def __init__(
        self,
        inbox: Inbox,
        *,
        bootstrap_servers: str,
        group_id: str,
        topics: list[str],
        config: Mapping[str, Any] | None = None,
        dead_letter: DeadLetterTopic | None = DEFAULT_DEAD_LETTER_TOPIC,
        acks_topic: str | None = None,
        offset_commit_interval: float = 0.0,
        metrics: InboxMetrics | None = None,
        poll_timeout: float = 0.5,
    ) -> None:
        self.inbox = inbox
        self.metrics = metrics
        self._pending = (
            PendingOffsets(offset_commit_interval, time.monotonic())
            if offset_commit_interval > 0
            else None
        )
        self.acks_topic = acks_topic
        self.topics = list(topics)
        self.poll_timeout = poll_timeout
        self.bootstrap_servers = bootstrap_servers
        self.dead_letter = dead_letter
        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": group_id,
            "auto.offset.reset": "earliest",
            **(config or {}),
            **_FORCED,
        }
        self._consumer = Consumer(conf)
        self._producer: Producer | None = None
        self._gate = PartitionGate()
        self._current: tuple[str, int] | None = None
        self._revoked = threading.Event()
        self._subscribed = False

    def __enter__(self) -> ConfluentInboxConsumer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        if not self._subscribed:
            self._consumer.subscribe(
                self.topics, on_revoke=self._on_revoke, on_lost=self._on_revoke
            )
            self._subscribed = True

    def close(self) -> None:
        try:
            if self._pending is not None:
                self._commit(self._pending.take())
            self._consumer.close()
            self.inbox.close()
        finally:
            if self._producer is not None:
                self._producer.flush(10)
                self._producer = None

    def run(self, stop: threading.Event | None = None, max_messages: int | None = None) -> int:
        """Process until ``stop`` is set (or ``max_messages`` deliveries were settled)."""
        self.start()
        handled = 0
        while not (stop is not None and stop.is_set()):
            if self.poll_once() is not None:
                handled += 1
                if max_messages is not None and handled >= max_messages:
                    break
        return handled

    def poll_once(self, timeout: float | None = None) -> Outcome | None:
        """Poll one message and settle it; ``None`` if nothing was processed."""
        self._resume_due()
        if self._pending is not None:
            self._commit(self._pending.due(time.monotonic()))
        msg = self._consumer.poll(self.poll_timeout if timeout is None else timeout)
        if msg is None:
            return None
        error = msg.error()
        if error is not None:
            if error.fatal():
                raise KafkaException(error)
            logger.warning("consumer error: %s", error)
            return None
        env = _envelope(msg)
        tp = (env.topic, env.partition)
        if not self._gate.accept(tp, env.offset):
            return None
        self._current = tp
        began = time.monotonic()
        self._revoked.clear()
        try:
            outcome = self.inbox.process(
                env, revoked=self._revoked.is_set, dead_letter=self._publish_dead_letter
            )
        except Exception:
            logger.exception("processing %s/%d/%d failed; retrying", *tp, env.offset)
            outcome = Outcome(OutcomeKind.RETRY, None, retry_in=_ERROR_RETRY_SECONDS)
        finally:
            self._current = None
        if self.metrics is not None:
            self.metrics.observe(self.inbox.settings.consumer, outcome, time.monotonic() - began)
        self._settle(env, outcome)
        return outcome

    def _settle(self, env: Envelope, outcome: Outcome) -> None:
        tp = TopicPartition(env.topic, env.partition, env.offset)
        if outcome.kind.advances_offset:
            self._acknowledge(env, outcome)
            if self._pending is not None:
                self._pending.settle((env.topic, env.partition), env.offset + 1)
            else:
                self._commit({(env.topic, env.partition): env.offset + 1})
            return
        if self._revoked.is_set():
            return
        try:
            self._consumer.seek(tp)
            self._consumer.pause([TopicPartition(env.topic, env.partition)])
        except KafkaException as exc:  # no longer assigned: its new owner takes it from here
            logger.info("not retrying %s/%d here: %s", env.topic, env.partition, exc)
            return
        self._gate.hold((env.topic, env.partition), env.offset, time.monotonic() + outcome.retry_in)

    def _commit(self, offsets: dict[tuple[str, int], int]) -> None:
        if not offsets:
            return
        try:
            self._consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                asynchronous=False,
            )
        except KafkaException as exc:
            # The database already holds the outcomes: a redelivery is recognised.
            logger.warning("offset commit failed (redelivery will be deduplicated): %s", exc)

    def _resume_due(self) -> None:
        for (topic, partition), offset in self._gate.due(time.monotonic()):
            self._consumer.resume([TopicPartition(topic, partition)])
            try:
                self._consumer.seek(TopicPartition(topic, partition, offset))
            except KafkaException as exc:
                logger.info("seek after resume of %s/%d failed: %s", topic, partition, exc)

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        revoked = [(p.topic, p.partition) for p in partitions]
        if self._current in revoked:
            self._revoked.set()
        self._gate.forget(revoked)
        if self._pending is not None:
            self._commit(self._pending.take(revoked))

    def _acknowledge(self, env: Envelope, outcome: Outcome) -> None:
        if self.acks_topic is None:
            return
        record = ack_record(self.inbox.settings.consumer, env, outcome)
        if record is None:
            return
        key, value, headers = record
        try:
            self._publish(self.acks_topic, key, value, headers)
        except PublishError as exc:
            # The outcome is durable in the database (readable with `outboxkit inbox show`).
            logger.warning("acknowledgement for %s not published: %s", outcome.event_id, exc)

    def _publish_dead_letter(self, env: Envelope, event_id: str, error: str, attempts: int) -> None:
        if self.dead_letter is None:
            return
        topic = dead_letter_topic(self.dead_letter, env.topic)
        headers = dead_letter_headers(
            env,
            consumer=self.inbox.settings.consumer,
            event_id=event_id,
            error=error,
            attempts=attempts,
        )
        self._publish(topic, env.key, env.value, headers)

    def _publish(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[Any]
    ) -> None:
        """Produce one record and wait for its acknowledgement (idempotent producer)."""
        if self._producer is None:
            self._producer = Producer(
                {
                    "bootstrap.servers": self.bootstrap_servers,
                    "enable.idempotence": True,
                    "acks": "all",
                }
            )
        failures: list[str] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                failures.append(str(err))

        try:
            self._producer.produce(topic, value, key=key, headers=headers, on_delivery=delivered)
            remaining = self._producer.flush(30)
        except (KafkaException, BufferError) as exc:
            raise PublishError(f"publish to {topic!r} failed: {exc}") from exc
        if remaining or failures:
            raise PublishError(f"publish to {topic!r} failed: {failures or 'timeout'}")


def _envelope(msg: Any) -> Envelope:
    ts_type, ts = msg.timestamp()
    return Envelope.from_parts(
        topic=msg.topic(),
        partition=msg.partition(),
        offset=msg.offset(),
        key=msg.key(),
        value=msg.value(),
        headers=msg.headers(),
        timestamp_ms=ts if ts_type else None,
    )
