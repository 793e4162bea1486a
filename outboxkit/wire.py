"""What travels with every message: header names and the content digest.

Shared by the writer (which stores the digest for idempotency), the relay (which turns row columns
into Kafka headers) and the consumer middleware (which reads them back and compares digests).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence

HEADER_EVENT_ID = "event-id"
HEADER_IDEMPOTENCY_KEY = "idempotency-key"
HEADER_EVENT_TYPE = "event-type"
HEADER_CONTENT_TYPE = "content-type"
HEADER_SCHEMA_VERSION = "schema-version"
HEADER_AGGREGATE_TYPE = "aggregate-type"
HEADER_AGGREGATE_ID = "aggregate-id"
HEADER_TRACEPARENT = "traceparent"
HEADER_TRACESTATE = "tracestate"

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
    topic_b = topic.encode()
    key_b = _opt(key)
    type_b = _opt(event_type)
    content_type_b = content_type.encode()
    # One buffer, one update: the same bytes as updating part by part, for less Python work.
    return hashlib.sha256(
        b"".join(
            (
                _LEN.pack(len(topic_b)),
                topic_b,
                _LEN.pack(len(key_b)),
                key_b,
                _LEN.pack(len(type_b)),
                type_b,
                _LEN.pack(len(content_type_b)),
                content_type_b,
                _LEN.pack(len(payload)),
                payload,
            )
        )
    ).digest()


def _opt(value: str | None) -> bytes:
    return b"\x00" if value is None else b"\x01" + value.encode()


def headers_to_dict(headers: KafkaHeaders | None) -> dict[str, str]:
    """Kafka headers (as both clients return them) to a str dict; later duplicates win."""
    out: dict[str, str] = {}
    for name, value in headers or ():
        if value is not None:
            out[name] = value.decode("utf-8", errors="replace")
    return out


def dict_to_headers(headers: Mapping[str, str]) -> list[tuple[str, bytes]]:
    return [(name, value.encode()) for name, value in headers.items()]
