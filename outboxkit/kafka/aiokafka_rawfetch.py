"""One fetch of one partition, parsed by outboxkit rather than aiokafka.

aiokafka decodes header names as UTF-8 while it parses a fetch, so one record whose header name
is not UTF-8 makes every ``getmany`` of its partition fail. Fetched here instead, such a record
comes back with a ``header_error`` (:func:`~outboxkit.kafka.record_batch.consumed`) and the
reader moves past it: the group consumer's lenient poll and the topic read-back both use it.
"""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.codec import gzip_decode, lz4_decode, snappy_decode, zstd_decode
from aiokafka.errors import KafkaError
from aiokafka.errors import for_code as error_for_code
from aiokafka.protocol.fetch import FetchRequest

from outboxkit.kafka.api import ConsumedRecord
from outboxkit.kafka.record_batch import committed_records, consumed, read_batches

logger = logging.getLogger("outboxkit.kafka.consumer")

_OFFSET_OUT_OF_RANGE = 1  # the Kafka protocol's error code
_CODECS = {1: gzip_decode, 2: snappy_decode, 3: lz4_decode, 4: zstd_decode}


def decompress(codec: int, data: bytes) -> bytes:
    decode = _CODECS.get(codec)
    if decode is None:
        raise KafkaError(f"unknown compression codec {codec}")
    return bytes(decode(data))


async def fetch_raw(
    consumer: AIOKafkaConsumer, max_bytes: int, tp: TopicPartition, offset: int
) -> tuple[list[ConsumedRecord], int | None]:
    """The committed records of one fetch from ``offset`` on, and the offset after them
    (``None``: ``offset`` is out of the log's range). A failed fetch is logged and returns
    nothing and ``offset``: the caller tries again."""
    client = consumer._client  # the consumer's own connections (and credentials)
    node = client.cluster.leader_for_partition(tp)
    if node is None or node < 0:
        return [], offset
    topics = [(tp.topic, [(tp.partition, offset, max_bytes)])]
    try:
        response = await client.send(node, FetchRequest(0, 1, max_bytes, 1, topics))
    except KafkaError as exc:
        logger.warning("fetching %s/%d again failed: %s", tp.topic, tp.partition, exc)
        return [], offset
    for _, partitions in response.topics:
        for _, error_code, _, *data in partitions:
            if error_code == _OFFSET_OUT_OF_RANGE:
                return [], None
            if error_code != 0:
                error = error_for_code(error_code).__name__
                logger.warning("fetching %s/%d again: %s", tp.topic, tp.partition, error)
                return [], offset
            # aborted transactions: the third field from v11 on, the last but one before
            aborted = (data[2] if response.API_VERSION >= 11 else data[-2]) or []
            batches = list(read_batches(bytes(data[-1] or b""), decompress))
            found = committed_records(batches, [(a[0], a[1]) for a in aborted], offset)
            end = batches[-1].next_offset if batches else offset
            return [consumed(tp.topic, tp.partition, r) for r in found], max(end, offset)
    return [], offset


__all__ = ["decompress", "fetch_raw"]
