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
from outboxkit.instant import utc_instant
from outboxkit.json_keys import check_json_keys
from outboxkit.limits import (
    MESSAGE_KEY_MAX_BYTES,
    PRODUCER_MESSAGE_MAX_BYTES,
    RECORD_OVERHEAD_BYTES,
    record_size,
)
from outboxkit.tracing import current_trace_headers
from outboxkit.wire import (
    HEADER_EVENT_TYPE,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_LIMITS,
    JSON_CONTENT_TYPE,
    RELAY_HEADERS,
    content_digest,
    header_problem,
)

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


def _too_large(topic: str, payload: bytes, size: int, limit: int) -> PayloadTooLargeError:
    why = (
        "librdkafka's default message.max.bytes, below the broker's default 1048588 per batch"
        if limit == PRODUCER_MESSAGE_MAX_BYTES
        else "OutboxConfig(max_message_bytes=...), which must match the relay producer's"
        " message.max.bytes"
    )
    return PayloadTooLargeError(
        f"message for topic {topic!r} would be a {size}-byte Kafka record (payload"
        f" {len(payload)} bytes, plus key, headers and {RECORD_OVERHEAD_BYTES} bytes of"
        f" framing); the limit is {limit} bytes: {why}. The relay's producer would refuse it,"
        " so it is not written.",
        size=size,
        max_message_bytes=limit,
    )


_topic_ok = lru_cache(maxsize=4096)(validate_topic)

_INT4_MAX = 2**31 - 1  # schema_version is an integer column
_SHORT_KEY = MESSAGE_KEY_MAX_BYTES // 4  # characters: at most 4 UTF-8 bytes each


def _kind(value: object) -> str:
    """A value described without quoting it (it may be a secret, or a megabyte): type, size."""
    kind = type(value).__name__
    if isinstance(value, str):
        return f"{kind} ({len(value)} characters)"
    if isinstance(value, bytes | bytearray | memoryview):
        return f"{kind} ({len(value)} bytes)"
    return kind


def _header(name: object) -> str:
    """A header by its name, bounded (names are not secrets; values are not shown)."""
    return (
        f"header {repr(name)[:80]}"
        if isinstance(name, str)
        else f"a header named by a {_kind(name)}"
    )


def _not_utf8(fields: Mapping[str, object], headers: Mapping[str, str]) -> str:
    """Which text field holds a lone surrogate: looked for only once one was found."""
    named: list[tuple[str, object]] = [*fields.items()]
    for name, text in headers.items():
        named += [(f"the name of {_header(name)}", name), (f"the value of {_header(name)}", text)]
    for field, value in named:
        try:
            if isinstance(value, str):
                value.encode()
        except UnicodeEncodeError as exc:
            return f"{field} is not valid UTF-8 (a lone surrogate at character {exc.start})"
    return "a text field is not valid UTF-8 (a lone surrogate)"


def _text(field: str, value: object) -> None:
    """A text column's value: a str (or None) PostgreSQL can store, i.e. without NUL."""
    if value is None:
        return
    if not isinstance(value, str):
        raise ValidationError(f"{field} must be a str or None, got {type(value).__name__}")
    if "\x00" in value:
        raise ValidationError(f"{field} contains a NUL character, which PostgreSQL cannot store")


def _identity(header: str, field: str, value: str) -> None:
    """An identity header as every consumer checks it on arrival (outboxkit.wire)."""
    if len(value) <= HEADER_LIMITS[header] and value.isascii() and value.isprintable():
        return  # the usual value: ASCII, one byte a character, nothing to decode
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        problem: str | None = "not valid UTF-8 (a lone surrogate)"
    else:
        problem = header_problem(raw, HEADER_LIMITS[header])
    if problem is not None:
        raise ValidationError(
            f"{field} refused: {problem}; consumers refuse such an {header!r} header"
        )


@lru_cache(maxsize=1024)
def _event_type_ok(event_type: str) -> None:
    """Checked once per distinct event type (a batch repeats a few)."""
    _text("event_type", event_type)
    _identity(HEADER_EVENT_TYPE, "event_type", event_type)


def _optional_fields(
    content_type: str,
    schema_version: object,
    aggregate_type: object,
    aggregate_id: object,
    event_id: object,
) -> None:
    """The fields most messages leave at their defaults, checked only when set."""
    if content_type is not JSON_CONTENT_TYPE:
        _text("content_type", content_type)
    if schema_version is not None and (
        type(schema_version) is not int or not 1 <= schema_version <= _INT4_MAX
    ):
        raise ValidationError(
            f"schema_version must be an int from 1 to {_INT4_MAX}, got {_kind(schema_version)}"
            + (" out of range" if type(schema_version) is int else "")
        )
    if aggregate_type is not None:
        _text("aggregate_type", aggregate_type)
    if aggregate_id is not None:
        _text("aggregate_id", aggregate_id)
    if event_id is not None and not isinstance(event_id, uuid.UUID):
        raise ValidationError(f"event_id must be a uuid.UUID, got {type(event_id).__name__}")


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


def _long_key(key: str) -> None:
    """A key the parked rows' index could not hold (see MESSAGE_KEY_MAX_BYTES)."""
    size = len(key.encode("utf-8", "surrogatepass"))  # a lone surrogate is refused later
    if size > MESSAGE_KEY_MAX_BYTES:
        raise ValidationError(
            f"message key is {size} bytes in UTF-8 (limit {MESSAGE_KEY_MAX_BYTES}): PostgreSQL"
            " could not index it if the row had to be parked, which would stall its shard"
        )


def _headers_json(headers: Mapping[str, str], event_type: str | None) -> str:
    plain = True  # names all exactly str: no two can be written alike (outboxkit.json_keys)
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise SerializationError(
                f"headers must map str to str: the value of {_header(name)} is {_kind(value)}"
            )
        if type(name) is not str:
            plain = False
        if "\x00" in name or "\x00" in value:
            raise SerializationError(
                f"{_header(name)} contains a NUL character, which PostgreSQL cannot store"
            )
        if name in RELAY_HEADERS:
            _relay_named(name, value, event_type)
    if not plain:
        check_json_keys(headers, "headers")
    return json.dumps(headers, ensure_ascii=False)


def _relay_named(name: str, value: str, event_type: str | None) -> None:
    """A header named like one of the relay's. Stored even when the relay replaces it, so it
    must encode; sent when no column replaces it, so an event type is checked as consumers do
    (its size is counted by record_size)."""
    if name == HEADER_EVENT_TYPE and event_type is None:
        _identity(HEADER_EVENT_TYPE, f"header {name!r}", value)
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise SerializationError(
            f"header {name!r} is not valid UTF-8 (a lone surrogate at {exc.start})"
        ) from None


def prepare(
    item: Writable,
    config: OutboxConfig,
    trace_headers: Mapping[str, str] | None = None,
    new_id: uuid.UUID | None = None,
    **overrides: Any,
) -> Row:
    """Validate and serialise one item. ``trace_headers``: the current trace context, when the
    caller already read it once for a whole batch (the context cannot change within one call).
    ``new_id``: the event id to use if the item brings none (``add_many`` makes them in bulk).
    ``overrides``: per-call options of ``add`` (``None`` values are no option)."""
    if overrides:
        msg = _as_message(item, overrides)
    elif type(item) is Message:
        msg = item
    elif isinstance(item, Event):
        # what Message.from_event(item) would hold, without building the Message (a tenth of
        # a typed event's preparation); the same methods run in the same order
        spec = item.outbox_spec()
        key = item.outbox_key()
        aggregate_id = item.outbox_aggregate_id()
        idempotency_key = item.outbox_idempotency_key()
        return _row(
            config, trace_headers, new_id, spec.topic, key, spec.event_type, item,
            JSON_CONTENT_TYPE, {}, None, idempotency_key, spec.schema_version,
            spec.aggregate_type, aggregate_id, None,
        )  # fmt: skip
    else:
        msg = _as_message(item, overrides)  # a Message subclass as is; anything else: refused
    return _row(
        config, trace_headers, new_id, msg.topic, msg.key, msg.event_type, msg.payload,
        msg.content_type, msg.headers, msg.event_id, msg.idempotency_key, msg.schema_version,
        msg.aggregate_type, msg.aggregate_id, msg.deliver_after,
    )  # fmt: skip


def _row(
    config: OutboxConfig,
    trace_headers: Mapping[str, str] | None,
    new_id: uuid.UUID | None,
    topic: str,
    key: str | None,
    event_type: str | None,
    payload: Any,
    content_type: str | None,
    headers: Mapping[str, str],
    event_id: uuid.UUID | None,
    idempotency_key: str | None,
    schema_version: int | None,
    aggregate_type: str | None,
    aggregate_id: str | None,
    deliver_after: datetime | None,
) -> Row:
    """One message's fields, checked in a fixed order (the first problem found is the error
    raised), to a row."""
    if type(topic) is str:
        _topic_ok(topic)
    else:
        validate_topic(topic)  # raises
    if key is not None:
        if not isinstance(key, str):
            raise ValidationError(f"message key must be a str or None, got {_kind(key)}")
        if "\x00" in key:
            raise ValidationError(
                "message key contains a NUL character, which PostgreSQL cannot store"
            )
        if len(key) > _SHORT_KEY:
            _long_key(key)
    if event_type is not None:
        if type(event_type) is not str:  # a StrEnum member is taken as its text
            if not isinstance(event_type, str):
                raise ValidationError(
                    f"message event_type must be a str or None, got {_kind(event_type)}"
                )
            event_type = str.__str__(event_type)
        _event_type_ok(event_type)
    if (  # an IntEnum member is taken as its number (a bool is refused below)
        type(schema_version) is not int
        and isinstance(schema_version, int)
        and not isinstance(schema_version, bool)
    ):
        schema_version = int(schema_version)
    data, content_type = encode_payload(payload, content_type)
    if (
        content_type is not JSON_CONTENT_TYPE
        or (
            schema_version is not None
            and not (type(schema_version) is int and 0 < schema_version <= _INT4_MAX)
        )
        or aggregate_type is not None
        or aggregate_id is not None
        or event_id is not None
    ):
        _optional_fields(content_type, schema_version, aggregate_type, aggregate_id, event_id)
    if deliver_after is not None:
        deliver_after = utc_instant(deliver_after)  # its tzinfo asked once, here
    if type(headers) is not dict:
        if isinstance(headers, Mapping):
            headers = dict(headers)  # json.dumps takes no other mapping (a mappingproxy, ...)
        elif headers is None:
            headers = {}  # no headers of its own
        else:
            raise SerializationError(f"headers must map str to str, got {type(headers).__name__}")
    if trace_headers is None:
        trace_headers = current_trace_headers()
    if trace_headers:
        headers = {**trace_headers, **headers}
    headers_json = _headers_json(headers, event_type) if headers else "{}"
    event_id = event_id or new_id or uuid7()
    if idempotency_key is None:
        idempotency_key = uuid_text(event_id)
    elif type(idempotency_key) is not str and not isinstance(idempotency_key, str):
        raise ValidationError(
            f"the idempotency key must be a str, got {type(idempotency_key).__name__}"
        )
    elif not idempotency_key:
        raise ValidationError("the idempotency key must not be empty")
    else:
        idempotency_key = str.__str__(idempotency_key)  # a str subclass as its text
        _identity(HEADER_IDEMPOTENCY_KEY, "the idempotency key", idempotency_key)
    optional = (event_type, schema_version, aggregate_type, aggregate_id)
    try:
        size = record_size(len(data), key, idempotency_key, content_type, optional, headers)
        digest = content_digest(
            topic=topic, key=key, event_type=event_type, content_type=content_type, payload=data
        )
    except UnicodeEncodeError:  # a lone surrogate ("\ud800") in a text field
        fields = {"message key": key, "the idempotency key": idempotency_key}
        fields |= {"content_type": content_type, "event_type": event_type}
        fields |= {"aggregate_type": aggregate_type, "aggregate_id": aggregate_id}
        raise ValidationError(_not_utf8(fields, headers)) from None
    if size > config.max_message_bytes:
        raise _too_large(topic, data, size, config.max_message_bytes)
    return Row(
        event_id,
        idempotency_key,
        digest,
        topic,
        key,
        data,
        content_type,
        headers_json,
        event_type,
        schema_version,
        aggregate_type,
        aggregate_id,
        deliver_after,
    )
