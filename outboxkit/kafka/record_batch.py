"""A lenient reader of Kafka record batches (message format v2), with header names as bytes.

aiokafka decodes every header name as UTF-8 while it parses a fetch, so one record with a name
that is not UTF-8 fails the fetch of every partition, again after each restart, and the records
after it in the same batch can never be read through it. This reader parses the raw bytes of a
fetch itself (the layout of the Kafka protocol's ``RecordBatch``): the aiokafka consumer uses it
only to get past such a fetch. Pure: decompression is passed in.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from outboxkit.kafka.api import ConsumedRecord, undecodable_name

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
_BATCH = struct.Struct(">qiibIhiqqqhii")
_LENGTH_END = 12  # batchLength counts the bytes after it
_CODEC_MASK, _LOG_APPEND_TIME, _TRANSACTIONAL, _CONTROL = 0x07, 0x08, 0x10, 0x20
_ABORT_MARKER = 0

Decompress = Callable[[int, bytes], bytes]  # (codec id, data) -> uncompressed records


class CorruptBatchError(ValueError):
    """Bytes that are not a well-formed record batch."""


class RawRecord(NamedTuple):
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[bytes, bytes | None], ...]


@dataclass
class Batch:
    base_offset: int
    next_offset: int
    producer_id: int
    transactional: bool
    control: bool
    records: list[RawRecord] = field(default_factory=list)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint (as Kafka writes lengths, deltas and counts) and the position after."""
    shift = result = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise CorruptBatchError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    length, pos = _varint(data, pos)
    if length < 0:
        return None, pos
    if pos + length > len(data):
        raise CorruptBatchError("a length past the end of the batch")
    return data[pos : pos + length], pos + length


def _records(
    data: bytes, count: int, base_offset: int, first_ts: int, append_ts: int | None
) -> list[RawRecord]:
    """``append_ts``: the batch's log-append time, which then stands for every record's."""
    records, pos = [], 0
    for _ in range(count):
        length, pos = _varint(data, pos)
        end = pos + length
        pos += 1  # attributes: unused
        ts_delta, pos = _varint(data, pos)
        offset_delta, pos = _varint(data, pos)
        key, pos = _bytes(data, pos)
        value, pos = _bytes(data, pos)
        count_headers, pos = _varint(data, pos)
        headers = []
        for _ in range(count_headers):
            name, pos = _bytes(data, pos)
            header_value, pos = _bytes(data, pos)
            headers.append((name or b"", header_value))
        if pos != end:
            raise CorruptBatchError(f"a record of {length} bytes read as {length + pos - end}")
        timestamp = first_ts + ts_delta if append_ts is None else append_ts
        records.append(RawRecord(base_offset + offset_delta, timestamp, key, value, tuple(headers)))
    return records


def read_batches(data: bytes, decompress: Decompress) -> Iterator[Batch]:
    """The complete v2 batches at the start of ``data``: a fetch may end in a partial batch,
    and a batch in an older format (no headers, so never the problem) ends the reading."""
    pos = 0
    while pos + _BATCH.size <= len(data):
        fields = _BATCH.unpack_from(data, pos)
        base, length, _, magic, _, attributes, last_delta, first_ts, max_ts, producer = fields[:10]
        end = pos + _LENGTH_END + length
        if magic != 2 or end > len(data) or end < pos + _BATCH.size:  # (a corrupt length)
            return
        body = data[pos + _BATCH.size : end]
        if attributes & _CODEC_MASK:
            body = decompress(attributes & _CODEC_MASK, body)
        append_ts = max_ts if attributes & _LOG_APPEND_TIME else None
        batch = Batch(
            base,
            base + last_delta + 1,
            producer,
            bool(attributes & _TRANSACTIONAL),
            bool(attributes & _CONTROL),
        )
        batch.records = _records(body, fields[12], base, first_ts, append_ts)
        yield batch
        pos = end


def _aborts(batch: Batch) -> bool:
    """Whether a control batch holds an abort marker (control record key: version, type)."""
    for record in batch.records:
        if record.key is not None and len(record.key) >= 4:
            marker: int = struct.unpack_from(">hh", record.key)[1]
            return marker == _ABORT_MARKER
    return False


def committed_records(
    batches: Sequence[Batch], aborted: Sequence[tuple[int, int]], start: int
) -> list[RawRecord]:
    """The data records a ``read_committed`` consumer delivers, from offset ``start`` on.

    ``aborted`` is the fetch response's list of (producer id, first offset) of the aborted
    transactions in the range: a transactional batch of such a producer is skipped until that
    producer's abort marker.
    """
    pending = sorted(aborted, key=lambda a: a[1])
    aborting: set[int] = set()
    out: list[RawRecord] = []
    for batch in batches:
        while pending and pending[0][1] <= batch.next_offset - 1:
            aborting.add(pending.pop(0)[0])
        if batch.control:
            if _aborts(batch):
                aborting.discard(batch.producer_id)
            continue
        if batch.transactional and batch.producer_id in aborting:
            continue
        out.extend(r for r in batch.records if r.offset >= start)
    return out


def consumed(topic: str, partition: int, record: RawRecord) -> ConsumedRecord:
    """The seam's record: header names decoded, or a ``header_error`` when one is not UTF-8."""
    headers: list[tuple[str, bytes | None]] = []
    header_error = None
    for name, value in record.headers:
        try:
            headers.append((name.decode("utf-8"), value))
        except UnicodeDecodeError:
            headers, header_error = [], undecodable_name(name)
            break
    return ConsumedRecord(
        topic,
        partition,
        record.offset,
        record.key,
        record.value,
        tuple(headers),
        record.timestamp_ms,
        header_error,
    )
