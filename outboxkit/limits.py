"""How large a Kafka record may be, counted the way the producer counts it.

The writer refuses a message the relay's producer would refuse later: such a row would be
accepted, then parked, and hold back every later message with its key. librdkafka (the confluent
relay) rejects a record when ``key + value + serialised headers + 36 bytes of framing`` exceeds
its ``message.max.bytes`` (default 1 000 000; measured against librdkafka 2.x: a bare value of
999 964 bytes passes, 999 965 does not). Each header serialises as a varint of its name's length,
the name, a varint of its value's length and the value. The broker's limit (``message.max.bytes``
1 048 588, per record batch including its 61-byte header) and aiokafka's ``max_request_size``
(1 048 576) are both larger, so the librdkafka figure is the one that binds by default.
"""

from __future__ import annotations

from collections.abc import Mapping

from outboxkit.wire import (
    HEADER_AGGREGATE_ID,
    HEADER_AGGREGATE_TYPE,
    HEADER_CONTENT_TYPE,
    HEADER_EVENT_ID,
    HEADER_EVENT_TYPE,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_SCHEMA_VERSION,
    RELAY_HEADERS,
)

#: librdkafka's default ``message.max.bytes``: the largest record its producer accepts.
PRODUCER_MESSAGE_MAX_BYTES = 1_000_000
#: librdkafka's range of ``message.max.bytes``: no producer takes a larger record.
MESSAGE_MAX_BYTES_RANGE = (1000, 1_000_000_000)
#: The broker's default ``message.max.bytes`` (and a topic's ``max.message.bytes``): one batch.
BROKER_MESSAGE_MAX_BYTES = 1_048_588
#: A v2 record batch's header, counted by the broker against its limit.
BATCH_OVERHEAD_BYTES = 61
#: The most framing librdkafka adds to one record (length, attributes, deltas, counts).
RECORD_OVERHEAD_BYTES = 36
#: The default limit of the writer: a record no larger than this passes both producer and broker.
DEFAULT_MAX_MESSAGE_BYTES = min(
    PRODUCER_MESSAGE_MAX_BYTES, BROKER_MESSAGE_MAX_BYTES - BATCH_OVERHEAD_BYTES
)
#: The longest message key, in UTF-8 bytes. A parked row's key goes into a btree index (shard,
#: message_key), whose entries PostgreSQL caps at ~2.7 KB (8 KB pages; less with smaller pages):
#: a longer key that does not compress could not be parked, and the relay would claim that row
#: again and again, holding back its whole shard. 1024, as for the event id and idempotency key.
MESSAGE_KEY_MAX_BYTES = 1024


def varint_size(length: int) -> int:
    """Bytes of a Kafka (zigzag) varint holding a non-negative length."""
    value, size = length << 1, 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def _sized(text: str) -> int:
    """A length-prefixed string in a record: varint of its UTF-8 length, then the bytes."""
    n = len(text) if text.isascii() else len(text.encode())
    return n + (1 if n < 64 else varint_size(n))


# The relay's headers, from the row's columns (wire.py): they replace user headers of that name,
# those of the optional columns only when the column is set (the user's header travels if not).
_OPTIONAL = (HEADER_EVENT_TYPE, HEADER_SCHEMA_VERSION, HEADER_AGGREGATE_TYPE, HEADER_AGGREGATE_ID)
_COLUMN_OF = {name: i for i, name in enumerate(_OPTIONAL)}
_EVENT_TYPE_NAME, _SCHEMA_VERSION_NAME, _AGGREGATE_TYPE_NAME, _AGGREGATE_ID_NAME = (
    _sized(name) for name in _OPTIONAL
)
# Framing, plus the headers every record carries, except their values of variable length.
_FIXED = (
    RECORD_OVERHEAD_BYTES
    + _sized(HEADER_EVENT_ID)
    + _sized("0" * 36)  # the event id as text
    + _sized(HEADER_IDEMPOTENCY_KEY)
    + _sized(HEADER_CONTENT_TYPE)
)


def record_size(
    payload_len: int,
    key: str | None,
    idempotency_key: str,
    content_type: str,
    optional: tuple[str | None, int | None, str | None, str | None],
    headers: Mapping[str, str],
) -> int:
    """The size the producer checks against ``message.max.bytes`` for the record the relay
    sends: key, payload, its headers (event id, idempotency key, content type, then event type,
    schema version, aggregate type and id when set; the row's own ``headers`` besides) and the
    framing. ``optional``: event type, schema version, aggregate type, aggregate id."""
    size = _FIXED + payload_len + _sized(idempotency_key) + _sized(content_type)
    if key:
        size += len(key) if key.isascii() else len(key.encode())
    event_type, schema_version, aggregate_type, aggregate_id = optional  # unrolled: per row
    if event_type is not None:
        size += _EVENT_TYPE_NAME + _sized(event_type)
    if schema_version is not None:
        size += _SCHEMA_VERSION_NAME + _sized(str(schema_version))
    if aggregate_type is not None:
        size += _AGGREGATE_TYPE_NAME + _sized(aggregate_type)
    if aggregate_id is not None:
        size += _AGGREGATE_ID_NAME + _sized(aggregate_id)
    for name, text in headers.items():
        if name not in RELAY_HEADERS or _sent_as_given(name, optional):
            size += _sized(name) + _sized(text)
    return size


def _sent_as_given(name: str, optional: tuple[object, ...]) -> bool:
    """Whether a user header named like one of the relay's travels: no column replaces it."""
    column = _COLUMN_OF.get(name)
    return column is not None and optional[column] is None
