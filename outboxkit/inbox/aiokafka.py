"""aiokafka adapter: an ``AIOKafkaConsumer`` loop driving the async :class:`AsyncInbox`.

Same rules as the confluent adapter: ``read_committed``, auto-commit off, offsets committed only
after the handler's transaction; failures pause and seek back the one partition. Because the
async handler yields to the event loop, a rebalance can revoke the partition *while* it runs:
the listener flags it and the handler's lease counts as lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

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
from outboxkit.inbox.middleware import AsyncInbox
from outboxkit.inbox.offsets import PendingOffsets
from outboxkit.inbox.outcome import Outcome, OutcomeKind

if TYPE_CHECKING:
    from outboxkit.inbox.metrics import InboxMetrics

logger = logging.getLogger("outboxkit.inbox.aiokafka")

_ERROR_RETRY_SECONDS = 1.0


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: AiokafkaInboxConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.owner._on_revoke([(tp.topic, tp.partition) for tp in revoked])

    async def on_partitions_assigned(self, assigned: Any) -> None:
        return None


class AiokafkaInboxConsumer:
    """Consume ``topics`` as group ``group_id`` and run each message through ``inbox``."""

    def __init__(
        self,
        inbox: AsyncInbox,
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
        max_records: int = 100,
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
        self.bootstrap_servers = bootstrap_servers
        self.dead_letter = dead_letter
        self.poll_timeout = poll_timeout
        self.max_records = max_records
        options: dict[str, Any] = {"auto_offset_reset": "earliest", **(config or {})}
        options.update(enable_auto_commit=False, isolation_level="read_committed")
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_servers, group_id=group_id, **options
        )
        self._producer: AIOKafkaProducer | None = None
        self._gate = PartitionGate()
        self._buffer: deque[Any] = deque()
        self._current: tuple[str, int] | None = None
        self._revoked = False
        self._started = False

    async def __aenter__(self) -> AiokafkaInboxConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        if not self._started:
            self._consumer.subscribe(self.topics, listener=_Listener(self))
            await self._consumer.start()
            self._started = True

    async def stop(self) -> None:
        try:
            if self._pending is not None and self._started:
                await self._commit(self._pending.take())
            await self._consumer.stop()
        finally:
            if self._producer is not None:
                await self._producer.stop()
                self._producer = None

    async def run(self, stop: asyncio.Event | None = None, max_messages: int | None = None) -> int:
        await self.start()
        handled = 0
        while not (stop is not None and stop.is_set()):
            if await self.poll_once() is not None:
                handled += 1
                if max_messages is not None and handled >= max_messages:
                    break
        return handled

    async def poll_once(self, wait: float | None = None) -> Outcome | None:
        """Process one buffered or fetched message; ``None`` if nothing was processed."""
        self._resume_due()
        if self._pending is not None:
            await self._commit(self._pending.due(time.monotonic()))
        if not self._buffer:
            wait = self.poll_timeout if wait is None else wait
            batches = await self._consumer.getmany(
                timeout_ms=int(wait * 1000), max_records=self.max_records
            )
            for records in batches.values():
                self._buffer.extend(records)
        if not self._buffer:
            return None
        msg = self._buffer.popleft()
        tp = (msg.topic, msg.partition)
        if TopicPartition(*tp) not in self._consumer.assignment():
            return None
        if not self._gate.accept(tp, msg.offset):
            return None
        env = Envelope.from_parts(
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            key=msg.key,
            value=msg.value,
            headers=msg.headers,
            timestamp_ms=msg.timestamp,
        )
        self._current = tp
        began = time.monotonic()
        self._revoked = False
        try:
            outcome = await self.inbox.process(
                env, revoked=self._is_revoked, dead_letter=self._publish_dead_letter
            )
        except Exception:
            logger.exception("processing %s/%d/%d failed; retrying", *tp, env.offset)
            outcome = Outcome(OutcomeKind.RETRY, None, retry_in=_ERROR_RETRY_SECONDS)
        finally:
            self._current = None
        if self.metrics is not None:
            self.metrics.observe(self.inbox.settings.consumer, outcome, time.monotonic() - began)
        await self._settle(env, outcome)
        return outcome

    def _is_revoked(self) -> bool:
        return self._revoked

    async def _settle(self, env: Envelope, outcome: Outcome) -> None:
        tp = TopicPartition(env.topic, env.partition)
        if outcome.kind.advances_offset:
            await self._acknowledge(env, outcome)
            if self._pending is not None:
                self._pending.settle((env.topic, env.partition), env.offset + 1)
            else:
                await self._commit({(env.topic, env.partition): env.offset + 1})
            return
        if self._revoked or tp not in self._consumer.assignment():
            return
        self._consumer.pause(tp)
        self._consumer.seek(tp, env.offset)
        self._buffer = deque(m for m in self._buffer if (m.topic, m.partition) != tp)
        self._gate.hold((env.topic, env.partition), env.offset, time.monotonic() + outcome.retry_in)

    async def _commit(self, offsets: dict[tuple[str, int], int]) -> None:
        if not offsets:
            return
        try:
            await self._consumer.commit({TopicPartition(t, p): o for (t, p), o in offsets.items()})
        except KafkaError as exc:
            logger.warning("offset commit failed (redelivery will be deduplicated): %s", exc)

    def _resume_due(self) -> None:
        for (topic, partition), offset in self._gate.due(time.monotonic()):
            tp = TopicPartition(topic, partition)
            if tp in self._consumer.assignment():
                self._consumer.seek(tp, offset)
                self._consumer.resume(tp)

    async def _on_revoke(self, revoked: list[tuple[str, int]]) -> None:
        if self._current in revoked:
            self._revoked = True
        self._gate.forget(revoked)
        self._buffer = deque(m for m in self._buffer if (m.topic, m.partition) not in revoked)
        if self._pending is not None:
            await self._commit(self._pending.take(revoked))

    async def _acknowledge(self, env: Envelope, outcome: Outcome) -> None:
        if self.acks_topic is None:
            return
        record = ack_record(self.inbox.settings.consumer, env, outcome)
        if record is None:
            return
        key, value, headers = record
        try:
            await self._publish(self.acks_topic, key, value, headers)
        except PublishError as exc:
            logger.warning("acknowledgement for %s not published: %s", outcome.event_id, exc)

    async def _publish_dead_letter(
        self, env: Envelope, event_id: str, error: str, attempts: int
    ) -> None:
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
        await self._publish(topic, env.key, env.value, headers)

    async def _publish(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[Any]
    ) -> None:
        """Send one record and wait for its acknowledgement (idempotent producer)."""
        if self._producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap_servers, enable_idempotence=True, acks="all"
            )
            await producer.start()
            self._producer = producer
        try:
            await self._producer.send_and_wait(topic, value, key=key, headers=headers)
        except KafkaError as exc:
            raise PublishError(f"publish to {topic!r} failed: {exc}") from exc
