"""The async consumer-group member on aiokafka.

The client is created when it subscribes (aiokafka objects belong to the running event loop).
The rebalance listener runs the seam's plain callbacks, commits what a revocation hands back,
and resumes every newly assigned partition.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from outboxkit.errors import ConfigurationError, PublishError
from outboxkit.kafka.api import AsyncGroupConsumer, ConsumedRecord, Rebalance, Revoke
from outboxkit.kafka.api import TopicPartition as TP
from outboxkit.kafka.config import CONSUMER_OPTIONS_HINT, aiokafka_options
from outboxkit.settings import KafkaSettings

logger = logging.getLogger("outboxkit.kafka.consumer")


def _tps(partitions: Any) -> list[TP]:
    return [(p.topic, p.partition) for p in partitions]


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: AiokafkaGroupConsumer, on_assign: Rebalance, on_revoke: Revoke):
        self.owner = owner
        self.on_assign = on_assign
        self.on_revoke = on_revoke

    async def on_partitions_revoked(self, revoked: Any) -> None:
        offsets = self.on_revoke(_tps(revoked))
        if offsets:
            try:
                await self.owner.commit(dict(offsets))
            except PublishError as exc:
                logger.warning("offset commit on revoke failed (redelivery is recognised): %s", exc)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.on_assign(_tps(assigned))
        self.owner.resume(_tps(assigned))


def _option_names() -> frozenset[str]:
    """The keyword arguments ``AIOKafkaConsumer`` takes (not its topics or its loop)."""
    names = inspect.signature(AIOKafkaConsumer.__init__).parameters
    return frozenset(names) - {"self", "topics", "loop"}


def _check_options(config: Mapping[str, Any]) -> None:
    """An option aiokafka does not take is refused when the consumer is built, not as a
    ``TypeError`` when it subscribes."""
    known = _option_names()
    unknown = sorted(str(name) for name in config if name not in known)
    if unknown:
        raise ConfigurationError(
            "the Kafka consumer (aiokafka) does not take the option"
            f" {', '.join(map(repr, unknown))}: aiokafka spells options as keyword arguments"
            f" (session_timeout_ms, not session.timeout.ms); {CONSUMER_OPTIONS_HINT}"
        )


class AiokafkaGroupConsumer(AsyncGroupConsumer):
    def __init__(
        self, settings: KafkaSettings, group_id: str, *, config: Mapping[str, Any] | None = None
    ) -> None:
        _check_options(config or {})
        self._options = aiokafka_options(
            settings,
            group_id=group_id,
            **{"auto_offset_reset": "earliest", **(config or {})},
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        self._consumer: AIOKafkaConsumer | None = None

    @property
    def _c(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise PublishError("the consumer has not subscribed yet")
        return self._consumer

    async def subscribe(self, topics: list[str], on_assign: Rebalance, on_revoke: Revoke) -> None:
        try:
            consumer = self._consumer = AIOKafkaConsumer(**self._options)
        except (TypeError, ValueError) as exc:  # its message may quote a value
            raise ConfigurationError(
                "the Kafka consumer (aiokafka) cannot be created: an option's value is not"
                f" accepted ({type(exc).__name__}; values not shown; {CONSUMER_OPTIONS_HINT})"
            ) from None
        consumer.subscribe(topics, listener=_Listener(self, on_assign, on_revoke))
        try:
            await consumer.start()
        except KafkaError as exc:
            self._consumer = None
            await consumer.stop()
            raise PublishError(f"Kafka consumer could not start: {exc}") from exc

    async def poll(self, wait: float, max_records: int) -> list[ConsumedRecord]:
        batches = await self._c.getmany(timeout_ms=int(wait * 1000), max_records=max_records)
        return [
            ConsumedRecord(
                m.topic,
                m.partition,
                m.offset,
                m.key,
                m.value,
                tuple(m.headers or ()),
                m.timestamp,
            )
            for records in batches.values()
            for m in records
        ]

    def assignment(self) -> set[TP]:
        return set(_tps(self._c.assignment())) if self._consumer is not None else set()

    def _only_assigned(self, partitions: list[TP]) -> list[TopicPartition]:
        current = self.assignment()
        return [TopicPartition(t, p) for t, p in partitions if (t, p) in current]

    def pause(self, partitions: list[TP]) -> None:
        self._c.pause(*self._only_assigned(partitions))

    def resume(self, partitions: list[TP]) -> None:
        self._c.resume(*self._only_assigned(partitions))

    def seek(self, partition: TP, offset: int) -> None:
        for tp in self._only_assigned([partition]):
            self._c.seek(tp, offset)

    async def commit(self, offsets: dict[TP, int]) -> None:
        if not offsets:
            return
        try:
            await self._c.commit({TopicPartition(t, p): o for (t, p), o in offsets.items()})
        except KafkaError as exc:
            raise PublishError(f"offset commit failed: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
