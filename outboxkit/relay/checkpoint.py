"""Exactly-once bookkeeping: the batch's outbox ids travel inside the same Kafka transaction.

Each transaction also writes the outbox ids and event ids to a compacted checkpoint topic, keyed
by ``<group>/<shard>``, on the shard's own partition. A relay that takes over a shard first calls
``init_transactions`` (which fences the old producer and resolves its open transaction), then reads
the last *committed* checkpoint of the shard (``read_committed``) and marks those rows published
before publishing anything. So a relay killed after the Kafka commit but before the database mark
leaves no duplicate behind for ``read_committed`` consumers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from uuid import UUID

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from outboxkit.errors import PublishError
from outboxkit.relay.producer.base import ProduceRequest

logger = logging.getLogger("outboxkit.relay.checkpoint")


def checkpoint_key(group: str, shard: int) -> bytes:
    return f"{group}/{shard}".encode()


@dataclass(frozen=True)
class Checkpoint:
    """The rows one committed transaction carried, as (outbox id, event id) pairs."""

    group: str
    shard: int
    token: int
    rows: tuple[tuple[int, UUID], ...]

    def encode(self) -> bytes:
        return json.dumps(
            {
                "token": self.token,
                "ids": [row_id for row_id, _ in self.rows],
                "event_ids": [str(event_id) for _, event_id in self.rows],
            }
        ).encode()

    @classmethod
    def decode(cls, group: str, shard: int, value: bytes) -> Checkpoint:
        body = json.loads(value)
        rows = tuple((int(i), UUID(e)) for i, e in zip(body["ids"], body["event_ids"], strict=True))
        return cls(group, shard, int(body["token"]), rows)


class CheckpointTopic:
    """Where checkpoints go and how the last committed one is read back."""

    def __init__(self, bootstrap: str, topic: str, *, timeout: float = 30.0) -> None:
        self._bootstrap = bootstrap
        self.topic = topic
        self._timeout = timeout
        self._partitions: int | None = None

    def request(self, checkpoint: Checkpoint) -> ProduceRequest:
        assert self._partitions is not None, "ensure() first"
        return ProduceRequest(
            topic=self.topic,
            key=checkpoint_key(checkpoint.group, checkpoint.shard),
            value=checkpoint.encode(),
            partition=checkpoint.shard % self._partitions,
        )

    async def ensure(self, shard_count: int) -> None:
        """Create the compacted topic if missing (auto-creation is usually off); learn its size."""
        if self._partitions is None:
            self._partitions = await asyncio.to_thread(self._ensure_sync, shard_count)

    def _ensure_sync(self, shard_count: int) -> int:
        admin = AdminClient({"bootstrap.servers": self._bootstrap})
        metadata = admin.list_topics(timeout=self._timeout)
        found = metadata.topics.get(self.topic)
        if found is None or found.error is not None:
            new = NewTopic(
                self.topic,
                num_partitions=max(1, shard_count),
                replication_factor=-1,
                config={"cleanup.policy": "compact", "segment.ms": "600000"},
            )
            for future in admin.create_topics([new], operation_timeout=self._timeout).values():
                try:
                    future.result(timeout=self._timeout)
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise PublishError(f"cannot create {self.topic}: {exc}") from exc
        deadline = time.monotonic() + self._timeout
        while found is None or found.error is not None or not found.partitions:
            # A topic just created may show up without partitions for a moment.
            if time.monotonic() > deadline:
                raise PublishError(f"checkpoint topic {self.topic} has no partitions")
            time.sleep(0.1)
            found = admin.list_topics(topic=self.topic, timeout=self._timeout).topics.get(
                self.topic
            )
        return len(found.partitions)

    async def last_committed(self, group: str, shard: int) -> Checkpoint | None:
        return await asyncio.to_thread(self._last_committed_sync, group, shard)

    def _last_committed_sync(self, group: str, shard: int) -> Checkpoint | None:
        assert self._partitions is not None, "ensure() first"
        partition = TopicPartition(self.topic, shard % self._partitions, OFFSET_BEGINNING)
        key = checkpoint_key(group, shard)
        consumer = Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": f"outboxkit-checkpoint-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        try:
            _, high = consumer.get_watermark_offsets(partition, timeout=self._timeout)
            consumer.assign([partition])
            last: Checkpoint | None = None
            deadline = time.monotonic() + self._timeout
            position = 0
            while position < high:
                if time.monotonic() > deadline:
                    raise PublishError("checkpoint topic not readable up to its end in time")
                msg = consumer.poll(0.5)
                if msg is None:
                    # Aborted records and markers are skipped without an EOF event: ask.
                    (now_at,) = consumer.position([partition])
                    position = max(position, now_at.offset or 0)
                    continue
                error = msg.error()
                offset = msg.offset() or 0
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        position = max(position, offset)
                        continue
                    raise PublishError(f"reading checkpoint failed: {error}")
                position = offset + 1
                value = msg.value()
                if msg.key() == key and value is not None:
                    last = Checkpoint.decode(group, shard, value)
            return last
        except KafkaException as exc:
            raise PublishError(f"reading checkpoint failed: {exc}") from exc
        finally:
            consumer.close()
