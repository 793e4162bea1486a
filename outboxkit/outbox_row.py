"""One item to one outbox row, without I/O: validate, serialise, digest, size-check.

Everything that can be refused is refused here, before anything is sent, so a failed
validation leaves the caller's transaction usable. ``add_many`` runs this once per item (on the
COPY path while the previous rows stream), so it is written for speed: the common ``Message``
with no per-call options takes no copies, the row is built positionally, and the parts of the
digest that repeat between messages (topic, event type, content type) are cached.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from outboxkit.errors import PayloadTooLargeError, SerializationError, ValidationError
from outboxkit.events import Event, Message, encode_payload, validate_topic
from outboxkit.ids import uuid7, uuid_text
from outboxkit.limits import PRODUCER_MESSAGE_MAX_BYTES, RECORD_OVERHEAD_BYTES, record_size
from outboxkit.tracing import current_trace_headers
from outboxkit.wire import content_digest

if TYPE_CHECKING:
    from outboxkit.outbox_plan import OutboxConfig

Writable = Event | Message


class Row(NamedTuple):
    """A validated, serialised message, ready for the INSERT (a tuple: cheap to build)."""

    event_id: uuid.UUID
    idempotency_key: str
    content_digest: bytes
    topic: str
    message_key: str | None
    payload: bytes
    content_type: str
    headers: str  # JSON text
    event_type: str | None
    schema_version: int | None
    aggregate_type: str | None
    aggregate_id: str | None
    deliver_after: datetime | None


def _too_large(msg: Message, payload: bytes, size: int, limit: int) -> PayloadTooLargeError:
    why = (
        "librdkafka's default message.max.bytes, below the broker's default 1048588 per batch"
        if limit == PRODUCER_MESSAGE_MAX_BYTES
        else "OutboxConfig(max_message_bytes=...), which must match the relay producer's"
        " message.max.bytes"
    )
    return PayloadTooLargeError(
        f"message for topic {msg.topic!r} would be a {size}-byte Kafka record (payload"
        f" {len(payload)} bytes, plus key, headers and {RECORD_OVERHEAD_BYTES} bytes of"
        f" framing); the limit is {limit} bytes: {why}. The relay's producer would refuse it,"
        " so it is not written.",
        size=size,
        max_message_bytes=limit,
    )


_topic_ok = lru_cache(maxsize=4096)(validate_topic)


def _as_message(item: Writable, overrides: Mapping[str, Any]) -> Message:
    if isinstance(item, Event):
        return Message.from_event(item, **overrides)
    if isinstance(item, Message):
        changes = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(item, **changes) if changes else item
    raise ValidationError(
        f"expected an outboxkit Event or Message, got {type(item).__name__}"
        " (wrap raw payloads in outboxkit.Message(topic=..., payload=...))"
    )


def _headers_json(headers: Mapping[str, str]) -> str:
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise SerializationError(f"headers must map str to str, got {name!r}: {value!r}")
    return json.dumps(headers, ensure_ascii=False)


def prepare(
    item: Writable,
    config: OutboxConfig,
    trace_headers: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Row:
    """Validate and serialise one item. ``trace_headers``: the current trace context, when the
    caller already read it once for a whole batch (the context cannot change within one call)."""
    msg = item if type(item) is Message and not overrides else _as_message(item, overrides)
    topic, key, event_type = msg.topic, msg.key, msg.event_type
    if type(topic) is str:
        _topic_ok(topic)
    else:
        validate_topic(topic)  # raises
    if key is not None and not isinstance(key, str):
        raise ValidationError(f"message key must be a str or None, got {key!r}")
    if event_type is not None and not isinstance(event_type, str):
        raise ValidationError(f"message event_type must be a str or None, got {event_type!r}")
    payload, content_type = encode_payload(msg.payload, msg.content_type)
    if trace_headers is None:
        trace_headers = current_trace_headers()
    headers = {**trace_headers, **msg.headers} if trace_headers else msg.headers
    headers_json = _headers_json(headers) if headers else "{}"
    event_id = msg.event_id or uuid7()
    idempotency_key = msg.idempotency_key
    if idempotency_key is None:
        idempotency_key = uuid_text(event_id)
    elif not idempotency_key:
        raise ValidationError("the idempotency key must not be empty")
    optional = (event_type, msg.schema_version, msg.aggregate_type, msg.aggregate_id)
    size = record_size(len(payload), key, idempotency_key, content_type, optional, headers)
    if size > config.max_message_bytes:
        raise _too_large(msg, payload, size, config.max_message_bytes)
    return Row(
        event_id,
        idempotency_key,
        content_digest(
            topic=topic, key=key, event_type=event_type, content_type=content_type, payload=payload
        ),
        topic,
        key,
        payload,
        content_type,
        headers_json,
        *optional,
        msg.deliver_after,
    )
