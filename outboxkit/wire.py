"""What travels with every message: header names and the content digest.

Shared by the writer (which stores the digest for idempotency), the relay (which turns row columns
into Kafka headers) and the consumer middleware (which reads them back and compares digests).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from functools import lru_cache

HEADER_EVENT_ID = "event-id"
HEADER_IDEMPOTENCY_KEY = "idempotency-key"
HEADER_EVENT_TYPE = "event-type"
HEADER_CONTENT_TYPE = "content-type"
HEADER_SCHEMA_VERSION = "schema-version"
HEADER_AGGREGATE_TYPE = "aggregate-type"
HEADER_AGGREGATE_ID = "aggregate-id"
HEADER_TRACEPARENT = "traceparent"
HEADER_TRACESTATE = "tracestate"
# The headers the relay builds from a row's columns; a user header of the same name is replaced
# only when its column is set (always, for the first three), and is sent as given otherwise.
RELAY_HEADERS = frozenset(
    (
        HEADER_EVENT_ID,
        HEADER_IDEMPOTENCY_KEY,
        HEADER_CONTENT_TYPE,
        HEADER_EVENT_TYPE,
        HEADER_SCHEMA_VERSION,
        HEADER_AGGREGATE_TYPE,
        HEADER_AGGREGATE_ID,
    )
)

# Byte caps of the identity headers (UTF-8). They become primary-key columns of the inbox, so
# they stay well inside PostgreSQL's btree index row limit (~2.7 KB). The writer refuses what
# a consumer would refuse (header_problem), so an event it accepts is never rejected on arrival.
HEADER_LIMITS: dict[str, int] = {
    HEADER_EVENT_ID: 1024,
    HEADER_IDEMPOTENCY_KEY: 1024,
    HEADER_EVENT_TYPE: 255,
}


def header_problem(raw: bytes, limit: int) -> str | None:
    """Why a raw identity header value is refused, or ``None``."""
    if len(raw) > limit:
        return f"{len(raw)} bytes (limit {limit})"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "not valid UTF-8"
    if not text.isprintable():
        return "contains control characters"
    return None


JSON_CONTENT_TYPE = "application/json"

_LEN = struct.Struct(">Q")  # the 8-byte big-endian length prefix of each digested part

KafkaHeaders = Sequence[tuple[str, bytes | None]]


def content_digest(
    *,
    topic: str,
    key: str | None,
    event_type: str | None,
    content_type: str,
    payload: bytes,
) -> bytes:
    """SHA-256 over the parts that make two messages "the same content".

    Length-prefixed so that no two different tuples hash alike. Headers such as trace context
    are deliberately left out: a retry from another trace is still the same event.
    """
    key_b = b"\x00" if key is None else b"\x01" + key.encode()
    # One buffer, one update: the same bytes as updating part by part, for less Python work;
    # the parts that repeat between messages are encoded once.
    return _sha256(
        b"".join(
            (
                _topic_part(topic),
                _LEN.pack(len(key_b)),
                key_b,
                _type_part(event_type, content_type),
                _LEN.pack(len(payload)),
                payload,
            )
        )
    ).digest()


_sha256 = hashlib.sha256


@lru_cache(maxsize=1024)
def _topic_part(topic: str) -> bytes:
    topic_b = topic.encode()
    return _LEN.pack(len(topic_b)) + topic_b


@lru_cache(maxsize=1024)
def _type_part(event_type: str | None, content_type: str) -> bytes:
    type_b = b"\x00" if event_type is None else b"\x01" + event_type.encode()
    content_type_b = content_type.encode()
    return _LEN.pack(len(type_b)) + type_b + _LEN.pack(len(content_type_b)) + content_type_b


def headers_to_dict(headers: KafkaHeaders | None) -> dict[str, str]:
    """Kafka headers (as both clients return them) to a str dict; later duplicates win."""
    out: dict[str, str] = {}
    for name, value in headers or ():
        if value is not None:
            out[name] = value.decode("utf-8", errors="replace")
    return out


def dict_to_headers(headers: Mapping[str, str]) -> list[tuple[str, bytes]]:
    return [(name, value.encode()) for name, value in headers.items()]
