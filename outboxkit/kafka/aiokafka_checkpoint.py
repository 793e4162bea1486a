"""Read one partition to its end, ``read_committed``, on aiokafka.

The end is the partition's high watermark as a ``read_uncommitted`` client sees it. A
``read_committed`` client reports the last stable offset instead: the first offset of the
oldest transaction still open. Reading only that far would miss a checkpoint committed after
another producer's transaction on the same partition began (another shard's, another relay
group's, or a dead relay's not yet aborted), and its rows would be published twice. So the read
waits for such transactions to end (aborted records are skipped) and times out if one stays open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from outboxkit.errors import PublishError, named
from outboxkit.kafka.aiokafka_admin import _UNAUTHORISED
from outboxkit.kafka.api import CheckpointReader
from outboxkit.kafka.config import aiokafka_reader_options
from outboxkit.kafka.errors import not_read_to_end
from outboxkit.settings import KafkaSettings


class AiokafkaCheckpointReader(CheckpointReader):
    def __init__(self, settings: KafkaSettings, *, timeout: float = 30.0) -> None:
        self._options = aiokafka_reader_options(settings, timeout)
        self._timeout = timeout

    async def last_values(
        self, topic: str, partition: int, keys: Collection[bytes]
    ) -> dict[bytes, bytes]:
        consumer = AIOKafkaConsumer(**self._options)
        # The high watermark, open transactions' records included, is what this one sees.
        watermark = AIOKafkaConsumer(**{**self._options, "isolation_level": "read_uncommitted"})
        where = f"{topic} [{partition}]"
        tp = TopicPartition(topic, partition)
        wanted = frozenset(keys)
        last: dict[bytes, bytes] = {}
        position, end = 0, None
        try:
            async with asyncio.timeout(self._timeout):
                await watermark.start()
                end = int((await watermark.end_offsets([tp]))[tp])
                await consumer.start()
                consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                while (position := await consumer.position(tp)) < end:
                    batch = await consumer.getmany(tp, timeout_ms=500)
                    for record in batch.get(tp, []):
                        if record.key not in wanted:
                            continue
                        if record.value is None:  # a tombstone: the key was deleted
                            last.pop(record.key, None)
                        else:
                            last[record.key] = record.value
            return last
        except TimeoutError:
            raise not_read_to_end(where, position, end) from None
        except (KafkaError, OSError) as exc:
            # The admin's names for the refusals; an OSError's errno is no Kafka error code.
            name = _UNAUTHORISED.get(exc.errno) if isinstance(exc, KafkaError) else None
            raise PublishError(f"reading {where} failed: {named(exc)}", error=name) from exc
        finally:
            try:
                await watermark.stop()
            finally:
                await consumer.stop()

    async def close(self) -> None:
        return None
