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

#: librdkafka's default ``message.max.bytes``: the largest record its producer accepts.
PRODUCER_MESSAGE_MAX_BYTES = 1_000_000
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


def varint_size(length: int) -> int:
    """Bytes of a Kafka (zigzag) varint holding a non-negative length."""
    value, size = length << 1, 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def record_size(key: bytes | None, value_len: int, headers: Mapping[str, str]) -> int:
    """The size the producer checks against ``message.max.bytes`` for one record."""
    size = RECORD_OVERHEAD_BYTES + value_len + (len(key) if key else 0)
    for name, text in headers.items():
        name_len, text_len = len(name.encode()), len(text.encode())
        size += varint_size(name_len) + name_len + varint_size(text_len) + text_len
    return size
