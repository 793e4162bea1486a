"""Read one partition to its end, ``read_committed``, on confluent-kafka (in a worker thread).

The end is the high watermark a ``read_uncommitted`` client sees, not the last stable offset a
``read_committed`` one reports (see ``aiokafka_checkpoint``): a checkpoint committed after another
producer's still-open transaction began must not be missed, so the read waits for it to end.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Collection
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from outboxkit.errors import PublishError
from outboxkit.kafka.api import CheckpointReader
from outboxkit.kafka.config import confluent_config
from outboxkit.kafka.confluent_build import create
from outboxkit.kafka.errors import not_read_to_end
from outboxkit.settings import KafkaSettings


class ConfluentCheckpointReader(CheckpointReader):
    def __init__(self, settings: KafkaSettings, *, timeout: float = 30.0) -> None:
        self._settings = settings
        self._timeout = timeout

    @staticmethod
    def _consumer_config(isolation: str = "read_committed") -> dict[str, Any]:
        """confluent-kafka wants a group.id even for assigned partitions, and librdkafka then
        looks for its coordinator, which needs Describe on that group. The read neither joins nor
        commits: a principal without a group ACL (none is documented for the relay) gets a
        coordinator error that says nothing about the read, and is passed over."""
        return {
            "group.id": f"outboxkit-checkpoint-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }

    def _consumer(self, isolation: str = "read_committed") -> Consumer:
        return create(
            Consumer,
            confluent_config(self._settings, None, **self._consumer_config(isolation)),
            "the checkpoint reader (confluent-kafka) cannot be created",
        )

    async def last_values(
        self, topic: str, partition: int, keys: Collection[bytes]
    ) -> dict[bytes, bytes]:
        return await asyncio.to_thread(self._last_values, topic, partition, frozenset(keys))

    def _last_values(
        self, topic: str, partition: int, keys: frozenset[bytes]
    ) -> dict[bytes, bytes]:
        deadline = time.monotonic() + self._timeout
        start = TopicPartition(topic, partition, OFFSET_BEGINNING)
        watermark = self._consumer("read_uncommitted")
        try:
            high = _high_watermark(watermark, start, deadline)
        except KafkaException as exc:
            raise _failed(topic, partition, exc) from None
        finally:
            watermark.close()
        consumer = self._consumer()
        try:
            consumer.assign([start])
            last: dict[bytes, bytes] = {}
            position = 0
            while position < high:
                if time.monotonic() > deadline:
                    raise not_read_to_end(f"{topic} [{partition}]", position, high)
                msg = consumer.poll(0.5)
                if msg is None:
                    # Aborted records and transaction markers are skipped without an EOF: ask.
                    (now_at,) = consumer.position([start])
                    position = max(position, now_at.offset or 0)
                    continue
                error = msg.error()
                offset = msg.offset() or 0
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        position = max(position, offset)
                        continue
                    if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                        continue  # the throwaway group's coordinator: see _consumer_config
                    raise PublishError(
                        f"reading {topic} [{partition}] failed: {error}", error=error.name()
                    )
                position = offset + 1
                if (key := msg.key()) in keys:
                    if (value := msg.value()) is None:  # a tombstone: the key was deleted
                        last.pop(key, None)
                    else:
                        last[key] = value
            return last
        except KafkaException as exc:
            raise _failed(topic, partition, exc) from None
        finally:
            consumer.close()

    async def close(self) -> None:
        return None


def _failed(topic: str, partition: int, exc: KafkaException) -> PublishError:
    """The read's failure, its librdkafka error named in ``context["error"]``."""
    error = exc.args[0] if exc.args else None
    name = error.name() if isinstance(error, KafkaError) else None
    return PublishError(f"reading {topic} [{partition}] failed: {exc}", error=name)


# A topic just created, or a partition whose leader moved, answers these for a moment; librdkafka
# does not retry ``get_watermark_offsets`` itself, so a takeover would fail on a transient state.
_TRANSIENT = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
    }
)


def _high_watermark(consumer: Consumer, start: TopicPartition, deadline: float) -> int:
    """The partition's high watermark, asked again while the broker answers a transient error."""
    pause = 0.05
    while True:
        try:
            _, high = consumer.get_watermark_offsets(
                start, timeout=max(0.1, deadline - time.monotonic())
            )
            return int(high)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            transient = isinstance(error, KafkaError) and (
                error.code() in _TRANSIENT or error.retriable()
            )
            if not transient or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)  # back-off between metadata retries, not a test wait
        pause = min(pause * 2, 1.0)
