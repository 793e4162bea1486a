"""``inbox replay``'s topic read and publishes on aiokafka, for a synchronous caller.

The caller is a click command acting on each record between reads, so the async clients run on
one :class:`asyncio.Runner` the object owns, a step at a time (a batch of records, a send):
no thread, and between steps nothing runs (no group: no heartbeat is missed). The end of a
partition is its ``read_committed`` end offset (the last stable offset) when the read begins:
a dead letter written later is left to the next run. A record whose header name is not UTF-8
(aiokafka's parser refuses the whole fetch) is read by :func:`fetch_raw` instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Generator

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import CorruptRecordException, KafkaError

from outboxkit.errors import PermanentPublishError, PublishError, named
from outboxkit.kafka.aiokafka_rawfetch import fetch_raw
from outboxkit.kafka.aiokafka_sender import AiokafkaRecordSender
from outboxkit.kafka.api import ConsumedRecord, Headers
from outboxkit.kafka.config import aiokafka_options, aiokafka_reader_options
from outboxkit.kafka.errors import not_read_to_end
from outboxkit.kafka.readback import TopicReadback
from outboxkit.settings import KafkaSettings

_BATCH = 100  # records a step hands over (with aiokafka's fetch sizes, what bounds memory)
_WAIT_MS = 500
_MAX_FETCH_BYTES = 1024 * 1024  # aiokafka's max_partition_fetch_bytes default


class AiokafkaTopicReadback(TopicReadback):
    def __init__(self, settings: KafkaSettings, *, timeout: float = 30.0) -> None:
        self._settings = settings
        self._timeout = timeout
        self._runner = asyncio.Runner()
        self._sender = AiokafkaRecordSender(settings, timeout=timeout)

    def records(self, topic: str) -> Generator[ConsumedRecord]:
        batches = _batches(self._settings, topic, self._timeout)
        try:
            while (batch := self._runner.run(_step(batches))) is not None:
                yield from batch
        finally:
            self._runner.run(batches.aclose())

    def start_sender(self) -> None:
        self._runner.run(self._sender.start())

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        self._runner.run(self._sender.send(topic, key, value, headers))

    def close(self) -> None:
        try:
            self._runner.run(self._sender.close())
        finally:
            self._runner.close()


async def _step(batches: AsyncGenerator[list[ConsumedRecord]]) -> list[ConsumedRecord] | None:
    try:
        return await anext(batches)
    except StopAsyncIteration:
        return None


async def _partitions(settings: KafkaSettings, topic: str, seconds: float) -> list[int]:
    """The topic's partitions from the cluster's list of topics (asking for all topics
    creates none, whatever the brokers' auto-creation setting)."""
    options = aiokafka_options(settings, request_timeout_ms=int(seconds * 1000))
    client = AIOKafkaClient(**options)
    try:
        await client.bootstrap()
        metadata = await client.fetch_all_metadata()
    finally:
        await client.close()
    if topic in metadata.unauthorized_topics:
        raise PermanentPublishError(f"topic {topic!r}: not authorised to describe it")
    found = metadata.partitions_for_topic(topic)
    if not found:
        raise PermanentPublishError(f"topic {topic!r} does not exist")
    return sorted(found)


async def _batches(
    settings: KafkaSettings, topic: str, seconds: float
) -> AsyncGenerator[list[ConsumedRecord]]:
    """The topic's committed records, a batch at a time, each partition up to its end."""
    options = aiokafka_reader_options(settings, seconds)
    consumer = AIOKafkaConsumer(**options)
    try:
        try:
            async with asyncio.timeout(seconds):
                found = await _partitions(settings, topic, seconds)
                tps = [TopicPartition(topic, p) for p in found]
                await consumer.start()
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                ends = {tp: int(end) for tp, end in (await consumer.end_offsets(tps)).items()}
                starts = {tp: int(await consumer.position(tp)) for tp in tps}
        except TimeoutError:
            raise PublishError(f"topic {topic!r}: no answer within {seconds:g} s") from None
        reader = _Reader(consumer, starts, ends, seconds)
        while reader.pending:
            batch = await reader.next_batch()
            if batch:
                yield batch
    except (KafkaError, OSError) as exc:
        raise PublishError(f"reading {topic!r} failed: {named(exc)}") from exc
    finally:
        await consumer.stop()


class _Reader:
    """Where each partition's read is; a partition at its end is paused and done. ``handed``:
    the offset after the last record handed out, per partition (a failed ``getmany`` may have
    moved a position past records it never returned, so a lenient read starts there)."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        starts: dict[TopicPartition, int],
        ends: dict[TopicPartition, int],
        timeout: float,
    ) -> None:
        self._c = consumer
        self._handed = dict(starts)
        self._ends = ends
        self._timeout = timeout
        self.pending = set(ends)

    async def next_batch(self) -> list[ConsumedRecord]:
        """Records (possibly none, once every partition is done); a ``PublishError`` when
        ``timeout`` passes with no record and no partition done."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        while True:
            await self._settle()
            if not self.pending:
                return []
            try:
                found = await self._c.getmany(
                    *self.pending, timeout_ms=_WAIT_MS, max_records=_BATCH
                )
                records = [
                    ConsumedRecord(
                        m.topic,
                        m.partition,
                        m.offset,
                        m.key,
                        m.value,
                        tuple(m.headers or ()),
                        m.timestamp,
                    )
                    for tp, got in found.items()
                    for m in got
                    if m.offset < self._ends[tp]
                ]
                for tp, got in found.items():
                    if got:
                        self._handed[tp] = got[-1].offset + 1
            except (UnicodeDecodeError, CorruptRecordException) as exc:
                cause = exc if isinstance(exc, UnicodeDecodeError) else exc.__cause__
                if not isinstance(cause, UnicodeDecodeError):
                    raise
                records = await self._leniently()
            if records:
                return records
            if loop.time() > deadline:
                tp = min(self.pending)
                position = int(await self._c.position(tp))
                raise not_read_to_end(f"{tp.topic} [{tp.partition}]", position, self._ends[tp])

    async def _settle(self) -> None:
        for tp in list(self.pending):
            if await self._c.position(tp) >= self._ends[tp]:
                self.pending.discard(tp)
                self._c.pause(tp)

    async def _leniently(self) -> list[ConsumedRecord]:
        """The pending partitions fetched and parsed here, each from where its handing out
        stopped (every one sought back there first)."""
        for tp in self.pending:
            self._c.seek(tp, self._handed[tp])
        records: list[ConsumedRecord] = []
        for tp in sorted(self.pending):
            found, after = await fetch_raw(self._c, _MAX_FETCH_BYTES, tp, self._handed[tp])
            records += [r for r in found if r.offset < self._ends[tp]]
            if after is not None:
                self._c.seek(tp, after)
                self._handed[tp] = after
        return records


__all__ = ["AiokafkaTopicReadback"]
