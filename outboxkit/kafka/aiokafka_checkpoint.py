"""Read one partition to its end, ``read_committed``, on aiokafka.

With ``read_committed`` the end offset aiokafka reports is the last stable offset: records of
transactions still open are not waited for, aborted ones are skipped.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from outboxkit.errors import PublishError
from outboxkit.kafka.api import CheckpointReader
from outboxkit.kafka.config import aiokafka_options
from outboxkit.settings import KafkaSettings


class AiokafkaCheckpointReader(CheckpointReader):
    def __init__(self, settings: KafkaSettings, *, timeout: float = 30.0) -> None:
        self._options = aiokafka_options(
            settings,
            group_id=None,
            isolation_level="read_committed",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=int(timeout * 1000),
        )
        self._timeout = timeout

    async def last_committed(self, topic: str, partition: int, key: bytes) -> bytes | None:
        consumer = AIOKafkaConsumer(**self._options)
        where = f"{topic} [{partition}]"
        tp = TopicPartition(topic, partition)
        last: bytes | None = None
        try:
            async with asyncio.timeout(self._timeout):
                await consumer.start()
                consumer.assign([tp])
                end = (await consumer.end_offsets([tp]))[tp]
                await consumer.seek_to_beginning(tp)
                while await consumer.position(tp) < end:
                    batch = await consumer.getmany(tp, timeout_ms=500)
                    for record in batch.get(tp, []):
                        if record.key == key:
                            last = record.value
            return last
        except TimeoutError:
            raise PublishError(f"{where} not readable to its end in time") from None
        except (KafkaError, OSError) as exc:
            raise PublishError(f"reading {where} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            await consumer.stop()

    async def close(self) -> None:
        return None
