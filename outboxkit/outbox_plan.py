"""The writer's logic without I/O: validate and serialise items, then plan the statements.

``prepare`` checks everything that can be checked before writing (topic name, size,
serialisation), so a failed validation sends nothing and leaves the caller's transaction usable.
A ``Plan`` is one add/add_many call: which statement to run next, and what its rows mean. The
sync and async executors in :mod:`outboxkit.outbox` drive the same plan.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from outboxkit.errors import (
    ConfigurationError,
    IdempotencyKeyConflictError,
    PayloadTooLargeError,
    SerializationError,
    ValidationError,
)
from outboxkit.events import Event, Message, encode_payload, validate_topic
from outboxkit.ids import uuid7
from outboxkit.schema import DEFAULT_SCHEMA, notify_channel, validate_schema_name
from outboxkit.tracing import current_trace_headers
from outboxkit.wire import (
    HEADER_AGGREGATE_ID,
    HEADER_AGGREGATE_TYPE,
    HEADER_CONTENT_TYPE,
    HEADER_EVENT_ID,
    HEADER_EVENT_TYPE,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_SCHEMA_VERSION,
    content_digest,
)

#: The producer's default ``max.request.size`` (the broker's ``message.max.bytes`` is 1048588).
DEFAULT_MAX_MESSAGE_BYTES = 1_048_576
_MAX_REREADS = 5

Writable = Event | Message
Statement = tuple[str, dict[str, Any]]  # (name in db/sql/outbox.sql, parameters)


@dataclass(frozen=True)
class OutboxConfig:
    """How the writer writes.

    ``notify``: send a transactional ``pg_notify`` (delivered on commit) so relays wake early;
    at most one per transaction and shard. Each notifying transaction takes PostgreSQL's global
    notify-queue lock at commit; switch it off when relays poll often enough.
    """

    schema: str = DEFAULT_SCHEMA
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    notify: bool = True

    def __post_init__(self) -> None:
        validate_schema_name(self.schema)
        if self.max_message_bytes < 1:
            raise ConfigurationError("max_message_bytes must be positive")


@dataclass(frozen=True)
class WriteResult:
    """The outcome of one add: ``duplicate`` means the key existed with the same content and
    nothing was written; ``event_id`` is then the existing event's id. ``id`` is the new row's id
    (``None`` for duplicates)."""

    event_id: uuid.UUID
    duplicate: bool
    id: int | None = None


@dataclass(frozen=True)
class Row:
    """A validated, serialised message, ready for the INSERT."""

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


_RELAY_HEADER_NAMES = (
    HEADER_EVENT_ID,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_CONTENT_TYPE,
    HEADER_EVENT_TYPE,
    HEADER_SCHEMA_VERSION,
    HEADER_AGGREGATE_TYPE,
    HEADER_AGGREGATE_ID,
)
_RELAY_HEADER_NAME_BYTES = sum(len(n) for n in _RELAY_HEADER_NAMES)


def _record_size(row: Row, headers: Mapping[str, str]) -> int:
    """Bytes the Kafka record will carry: payload, key, user headers and the relay's headers
    (names and values; an upper bound, as the relay may leave empty ones out)."""
    size = len(row.payload) + _RELAY_HEADER_NAME_BYTES + 36  # the event id as text
    for text in (
        row.message_key,
        row.idempotency_key,
        row.content_type,
        row.event_type,
        row.aggregate_type,
        row.aggregate_id,
    ):
        if text:
            size += len(text.encode())
    if row.schema_version is not None:
        size += len(str(row.schema_version))
    for name, value in headers.items():
        size += len(name.encode()) + len(value.encode())
    return size


_topic_ok = lru_cache(maxsize=4096)(validate_topic)


def prepare(
    item: Writable,
    config: OutboxConfig,
    trace_headers: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Row:
    """Validate and serialise one item. ``trace_headers``: the current trace context, when the
    caller already read it once for a whole batch (the context cannot change within one call)."""
    if isinstance(item, Event):
        msg = Message.from_event(item, **overrides)
    elif isinstance(item, Message):
        changes = {k: v for k, v in overrides.items() if v is not None}
        msg = dataclasses.replace(item, **changes) if changes else item
    else:
        raise ValidationError(
            f"expected an outboxkit Event or Message, got {type(item).__name__}"
            " (wrap raw payloads in outboxkit.Message(topic=..., payload=...))"
        )
    topic = msg.topic
    if isinstance(topic, str):
        _topic_ok(topic)
    else:
        validate_topic(topic)  # raises
    if msg.key is not None and not isinstance(msg.key, str):
        raise ValidationError(f"message key must be a str or None, got {msg.key!r}")
    if msg.event_type is not None and not isinstance(msg.event_type, str):
        raise ValidationError(f"message event_type must be a str or None, got {msg.event_type!r}")
    payload, content_type = encode_payload(msg.payload, msg.content_type)
    if trace_headers is None:
        trace_headers = current_trace_headers()
    headers = {**trace_headers, **msg.headers} if trace_headers else msg.headers
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise SerializationError(f"headers must map str to str, got {name!r}: {value!r}")
    headers_json = json.dumps(headers, ensure_ascii=False) if headers else "{}"
    event_id = msg.event_id or uuid7()
    idempotency_key = msg.idempotency_key if msg.idempotency_key is not None else str(event_id)
    if not idempotency_key:
        raise ValidationError("the idempotency key must not be empty")
    row = Row(
        event_id=event_id,
        idempotency_key=idempotency_key,
        content_digest=content_digest(
            topic=topic,
            key=msg.key,
            event_type=msg.event_type,
            content_type=content_type,
            payload=payload,
        ),
        topic=topic,
        message_key=msg.key,
        payload=payload,
        content_type=content_type,
        headers=headers_json,
        event_type=msg.event_type,
        schema_version=msg.schema_version,
        aggregate_type=msg.aggregate_type,
        aggregate_id=msg.aggregate_id,
        deliver_after=msg.deliver_after,
    )
    size = _record_size(row, headers)
    if size > config.max_message_bytes:
        raise PayloadTooLargeError(
            f"message for topic {topic!r} is {size} bytes (payload, key and headers);"
            f" the configured maximum is {config.max_message_bytes}",
            size=size,
            max_message_bytes=config.max_message_bytes,
        )
    return row


class Plan:
    """One add/add_many call: the prepared rows, their results, and the SQL still to run.

    The sync and async entry points drive the same plan; only the ``execute`` differs.
    """

    def __init__(self, config: OutboxConfig, rows: Sequence[Row]) -> None:
        self.config = config
        self.rows = rows
        # Repeats of a key within the call are folded onto its first occurrence.
        self.first_of: list[int] = []
        self.unique: list[int] = []
        seen: dict[str, int] = {}
        event_ids: set[uuid.UUID] = set()
        for index, row in enumerate(rows):
            first = seen.get(row.idempotency_key)
            if first is None:
                if row.event_id in event_ids:
                    raise ValidationError(f"event id {row.event_id} appears twice in one call")
                event_ids.add(row.event_id)
                seen[row.idempotency_key] = index
                self.unique.append(index)
                self.first_of.append(index)
            elif rows[first].content_digest != row.content_digest:
                raise IdempotencyKeyConflictError(
                    f"idempotency key {row.idempotency_key!r} is used twice in one call"
                    " with different content",
                    idempotency_key=row.idempotency_key,
                )
            else:
                self.first_of.append(first)
        self.results: dict[int, WriteResult] = {}
        self.written_ids: list[int] = []
        self.conflict: IdempotencyKeyConflictError | None = None
        self.rereads = 0

    def pending(self) -> list[int]:
        return [i for i in self.unique if i not in self.results]

    def insert_statement(self, notified: tuple[str | None, list[int]]) -> Statement:
        channel = notify_channel(self.config.schema) if self.config.notify else None
        common = {"channel": channel, "notified_xact": notified[0], "notified_shards": notified[1]}
        todo = [self.rows[i] for i in self.pending()]
        if len(todo) == 1:
            row = todo[0]
            return "insert_one", {
                **common,
                **vars(row),
            }
        return "insert_many", {
            **common,
            "event_ids": [r.event_id for r in todo],
            "idempotency_keys": [r.idempotency_key for r in todo],
            "content_digests": [r.content_digest for r in todo],
            "topics": [r.topic for r in todo],
            "message_keys": [r.message_key for r in todo],
            "payloads": [r.payload for r in todo],
            "content_types": [r.content_type for r in todo],
            "headers": [r.headers for r in todo],
            "event_types": [r.event_type for r in todo],
            "schema_versions": [r.schema_version for r in todo],
            "aggregate_types": [r.aggregate_type for r in todo],
            "aggregate_ids": [r.aggregate_id for r in todo],
            "deliver_afters": [r.deliver_after for r in todo],
        }

    def take_inserted(self, result_rows: Sequence[Any]) -> tuple[str | None, set[int]]:
        """Record the rows an insert wrote; returns (transaction id, shards notified)."""
        by_event_id = {self.rows[i].event_id: i for i in self.pending()}
        xact: str | None = None
        shards: set[int] = set()
        for row_id, event_id, shard, xact_id, notified in result_rows:
            self.results[by_event_id[event_id]] = WriteResult(
                event_id=event_id, duplicate=False, id=row_id
            )
            self.written_ids.append(row_id)
            xact = xact_id
            if notified:
                shards.add(shard)
        return xact, shards

    def reread_statement(self) -> Statement | None:
        todo = self.pending()
        if not todo or self.conflict is not None:
            return None
        self.rereads += 1
        return "select_by_idempotency_keys", {
            "idempotency_keys": [self.rows[i].idempotency_key for i in todo]
        }

    def take_reread(self, result_rows: Sequence[Any]) -> None:
        by_key = {self.rows[i].idempotency_key: i for i in self.pending()}
        for key, event_id, digest in result_rows:
            self._existing(by_key[key], event_id, bytes(digest))

    def needs_retry(self) -> bool:
        """Rows whose conflicting row vanished (deleted) between insert and re-read."""
        if self.conflict is not None or not self.pending():
            return False
        if self.rereads >= _MAX_REREADS:  # give up, but undo this call's rows first
            self.conflict = IdempotencyKeyConflictError(
                "could not settle the idempotency keys of this call (rows keep disappearing)"
            )
            return False
        return True

    def undo_statement(self) -> Statement | None:
        if self.conflict is None or not self.written_ids:
            return None
        return "delete_written", {"ids": self.written_ids}

    def outcome(self) -> list[WriteResult]:
        if self.conflict is not None:
            raise self.conflict
        out = []
        for index, first in enumerate(self.first_of):
            result = self.results[first]
            if index != first:
                result = dataclasses.replace(result, duplicate=True, id=None)
            out.append(result)
        return out

    def _existing(self, index: int, event_id: uuid.UUID, digest: bytes) -> None:
        row = self.rows[index]
        if digest == row.content_digest:
            self.results[index] = WriteResult(event_id=event_id, duplicate=True)
        elif self.conflict is None:
            self.conflict = IdempotencyKeyConflictError(
                f"idempotency key {row.idempotency_key!r} was already used for different"
                f" content (event {event_id})",
                idempotency_key=row.idempotency_key,
                existing_event_id=event_id,
            )
