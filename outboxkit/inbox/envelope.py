"""A delivered Kafka message, client-neutral, and what the middleware reads from its headers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from outboxkit.errors import DecodeError, MissingEventIdError
from outboxkit.inbox.frozen import build
from outboxkit.inbox.guard import InvalidHeaderError, check_headers, error_text, hashed
from outboxkit.kafka.api import ConsumedRecord
from outboxkit.wire import (
    HEADER_CONTENT_TYPE,
    HEADER_EVENT_ID,
    HEADER_EVENT_TYPE,
    HEADER_IDEMPOTENCY_KEY,
    HEADER_LIMITS,
    JSON_CONTENT_TYPE,
    KafkaHeaders,
    content_digest,
    header_problem,
    headers_to_dict,
)


@dataclass(frozen=True)
class Envelope:
    """One delivery, client-neutral."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str] = field(default_factory=dict)
    raw_headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None
    header_error: str | None = None  # why the client could not read the headers

    @classmethod
    def from_parts(
        cls,
        *,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: KafkaHeaders | None,
        timestamp_ms: int | None = None,
    ) -> Envelope:
        raw = tuple((str(n), v) for n, v in headers or ())
        return cls(topic, partition, offset, key, value, headers_to_dict(raw), raw, timestamp_ms)

    @classmethod
    def from_record(cls, record: ConsumedRecord) -> Envelope:
        """From the client seam's record (either client)."""
        topic, partition, offset, key, value, headers, timestamp_ms, header_error = record
        if timestamp_ms is not None and timestamp_ms < 0:
            timestamp_ms = None
        return build(
            cls,
            topic=topic,
            partition=partition,
            offset=offset,
            key=key,
            value=value,
            headers=headers_to_dict(headers),
            raw_headers=headers,
            timestamp_ms=timestamp_ms,
            header_error=header_error,
        )


EventIdFrom = Callable[[Envelope], str | None]


@dataclass(frozen=True)
class Identity:
    """What makes a delivery "the same event": its id, idempotency key and content digest."""

    event_id: str
    idempotency_key: str
    event_type: str | None
    content_type: str
    digest: bytes


def identify(envelope: Envelope, event_id_from: EventIdFrom | None = None) -> Identity:
    """Read the event id (header, or the configured callable) and compute the content digest.

    A message without an event id is *not* given one derived from topic/partition/offset: a
    relay duplicate sits at another offset, so such an id would silently defeat deduplication.
    It is rejected instead, unless the application supplies ``event_id_from``.
    """
    if envelope.header_error is not None:
        raise InvalidHeaderError(f"headers refused: {envelope.header_error}", safe_event_id=None)
    if not _plain_headers(envelope.raw_headers):
        check_headers(envelope.raw_headers)
    headers = envelope.headers
    event_id = headers.get(HEADER_EVENT_ID) or None
    if event_id is None and event_id_from is not None:
        event_id = _call_event_id_from(event_id_from, envelope)
        raw = (event_id or "").encode("utf-8", errors="surrogatepass")
        problem = header_problem(raw, HEADER_LIMITS[HEADER_EVENT_ID])
        if problem is not None:
            message = f"event id from event_id_from refused: {problem}"
            raise InvalidHeaderError(message, safe_event_id=hashed(raw))
    if event_id is None:
        raise MissingEventIdError("the message has no event-id header")
    event_type = headers.get(HEADER_EVENT_TYPE) or None
    content_type = headers.get(HEADER_CONTENT_TYPE) or JSON_CONTENT_TYPE
    key = envelope.key.decode("utf-8", errors="replace") if envelope.key is not None else None
    digest = content_digest(
        topic=envelope.topic,
        key=key,
        event_type=event_type,
        content_type=content_type,
        payload=envelope.value or b"",
    )
    return build(
        Identity,
        event_id=event_id,
        idempotency_key=headers.get(HEADER_IDEMPOTENCY_KEY) or event_id,
        event_type=event_type,
        content_type=content_type,
        digest=digest,
    )


def _plain_headers(raw_headers: tuple[tuple[str, bytes | None], ...]) -> bool:
    """Whether every identity header (each occurrence) is short, printable ASCII: then
    :func:`check_headers` has nothing to refuse (it is asked only otherwise, for its reason).
    ASCII bytes are valid UTF-8 of the same length, and printable as text exactly when no byte
    is a control character."""
    for name, value in raw_headers:
        limit = HEADER_LIMITS.get(name)
        if limit is None or value is None:
            continue
        if len(value) > limit or not value.isascii() or not value.decode("ascii").isprintable():
            return False
    return True


def _call_event_id_from(event_id_from: EventIdFrom, envelope: Envelope) -> str | None:
    """The application's callable, on a record that may be anything (a tombstone, a value
    that is not JSON). Whatever it raises or returns other than text is this record's problem:
    a :class:`DecodeError` (the record is rejected with the reason), never an error retried
    for ever on the same offset."""
    try:
        found = event_id_from(envelope)
    except Exception as exc:  # the class and first line, no bound SQL parameters
        raise DecodeError(f"event_id_from raised {error_text(exc).rstrip(': ')}") from exc
    if found is not None and not isinstance(found, str):
        raise DecodeError(f"event_id_from returned {type(found).__name__}, not str or None")
    return found or None
