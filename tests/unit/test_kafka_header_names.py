"""Header names that are not UTF-8, at the Kafka seam: confluent-kafka's ``headers()`` failing,
and the lenient batch reader the aiokafka consumer falls back on (the real-stack counterpart is
in tests/integration/test_inbox_hostile.py)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from aiokafka.codec import gzip_decode
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from outboxkit.kafka.api import ConsumedRecord
from outboxkit.kafka.confluent_consumer import consumed_record
from outboxkit.kafka.record_batch import (
    Batch,
    CorruptBatchError,
    RawRecord,
    committed_records,
    consumed,
    read_batches,
)
from tests.support.raw_headers import RawNames

pytestmark = pytest.mark.unit

BAD = "a header name is not valid UTF-8: b'\\xff\\xfe'"


class _Message:
    """What ``consumed_record`` reads of a confluent-kafka message whose headers() fails as the real
    one does (a SystemError wrapping the UnicodeDecodeError)."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def headers(self) -> Any:
        if self.error is not None:
            raise self.error
        return [("event-id", b"e1")]

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 2

    def offset(self) -> int:
        return 7

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"{}"

    def timestamp(self) -> tuple[int, int]:
        return (1, 1700)


def _system_error() -> SystemError:
    try:
        try:
            b"\xff\xfe".decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SystemError("<method 'headers'> returned a result with an exception set") from exc
    except SystemError as exc:
        return exc
    raise AssertionError


def test_confluent_record_with_an_undecodable_header_name_carries_the_reason() -> None:
    record = consumed_record(_Message(_system_error()))  # type: ignore[arg-type]
    assert record == ConsumedRecord("orders", 2, 7, b"k", b"{}", (), 1700, BAD)
    fine = consumed_record(_Message(None))  # type: ignore[arg-type]
    assert (fine.headers, fine.header_error) == ((("event-id", b"e1"),), None)
    with pytest.raises(SystemError):  # any other SystemError is not ours to hide
        consumed_record(_Message(SystemError("something else")))  # type: ignore[arg-type]


def _batch(
    base: int,
    messages: list[tuple[bytes | None, list[tuple[str | bytes, bytes | None]]]],
    codec: int = 0,
) -> bytes:
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1_000_000)
    names = RawNames()
    for i, (value, headers) in enumerate(messages):
        builder.append(i, timestamp=1000 + i, key=b"k", value=value, headers=names.headers(headers))
    data = names.patch(bytes(builder.build()))
    return struct.pack(">q", base) + data[8:]  # the broker assigns the base offset


def _decompress(codec: int, data: bytes) -> bytes:
    assert codec == 1
    return bytes(gzip_decode(data))


def test_the_lenient_reader_keeps_every_record_and_names_the_undecodable_one() -> None:
    first = _batch(
        10,
        [
            (b"a", [("event-id", b"e1")]),
            (b"b", [(b"\xff\xfe", b"x"), ("event-id", b"e2")]),
            (None, []),
        ],
    )
    second = _batch(13, [(b"d", [("event-id", b"e4"), ("empty", None)])])
    data = first + second + second[:20]  # a fetch may end in a partial batch
    batches = list(read_batches(data, _decompress))
    assert [(b.base_offset, b.next_offset) for b in batches] == [(10, 13), (13, 14)]
    records = committed_records(batches, [], start=11)  # 10 was handed out already
    assert [r.offset for r in records] == [11, 12, 13]
    assert records[0].headers == ((b"\xff\xfe", b"x"), (b"event-id", b"e2"))
    assert records[1].value is None
    seam = [consumed("orders", 0, r) for r in records]
    assert seam[0] == ConsumedRecord("orders", 0, 11, b"k", b"b", (), 1001, BAD)
    assert seam[2] == ConsumedRecord(
        "orders", 0, 13, b"k", b"d", (("event-id", b"e4"), ("empty", None)), 1000
    )


def test_the_lenient_reader_decompresses() -> None:
    data = _batch(5, [(b"a", [("event-id", b"e1")]), (b"b", [("event-id", b"e2")])], codec=1)
    (batch,) = read_batches(data, _decompress)
    assert [(r.offset, r.value, r.headers) for r in batch.records] == [
        (5, b"a", ((b"event-id", b"e1"),)),
        (6, b"b", ((b"event-id", b"e2"),)),
    ]


def test_the_lenient_reader_refuses_a_malformed_record() -> None:
    data = bytearray(_batch(0, [(b"a", [("event-id", b"e1")])]))
    data[61] = 0x7E  # the record's length varint: longer than the record
    with pytest.raises(CorruptBatchError):
        list(read_batches(bytes(data), _decompress))


def _raw(offset: int, key: bytes | None = b"k") -> RawRecord:
    return RawRecord(offset, 0, key, b"v", ())


def _control(offset: int, producer: int, marker: int) -> Batch:
    return Batch(
        offset, offset + 1, producer, True, True, [_raw(offset, struct.pack(">hh", 0, marker))]
    )


def test_read_committed_skips_aborted_transactions_and_control_batches() -> None:
    batches = [
        Batch(0, 2, 7, True, False, [_raw(0), _raw(1)]),  # producer 7: aborted below
        Batch(2, 3, -1, False, False, [_raw(2)]),  # not transactional
        Batch(3, 4, 8, True, False, [_raw(3)]),  # producer 8: committed
        _control(4, 7, marker=0),  # abort marker of 7
        _control(5, 8, marker=1),  # commit marker of 8
        Batch(6, 7, 7, True, False, [_raw(6)]),  # producer 7 again, a later transaction
        _control(7, 7, marker=1),
    ]
    kept = committed_records(batches, aborted=[(7, 0)], start=0)
    assert [r.offset for r in kept] == [2, 3, 6]
