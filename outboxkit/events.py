"""What an application hands to the outbox: typed events (pydantic) or raw messages.

A typed event declares where it goes and what it is once, on the class::

    class OrderPlaced(Event, topic="orders", key="order_id", event_type="order.placed"):
        order_id: str
        total_cents: int

Raw messages (:class:`Message`) carry bytes, text or JSON-able data for anything else. Both are
turned into the same row by :mod:`outboxkit.outbox`; this module only knows how to describe and
serialise them, and which topic names Kafka accepts.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, ClassVar

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, SchemaSerializer

from outboxkit.errors import ConfigurationError, InvalidTopicError, SerializationError
from outboxkit.json_keys import check_json_keys
from outboxkit.wire import JSON_CONTENT_TYPE

TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
BYTES_CONTENT_TYPE = "application/octet-stream"

_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]+")  # fullmatch: "$" would let a final "\n" through
MAX_TOPIC_LENGTH = 249
# Kafka's own topics: a transactional producer cannot write to them (the broker refuses the
# partition, and confluent-kafka then fails the whole transaction at every try).
INTERNAL_TOPICS = frozenset(
    {"__consumer_offsets", "__transaction_state", "__share_group_state", "__cluster_metadata"}
)


def validate_topic(topic: object) -> str:
    """The topic name if Kafka would accept it, else :class:`InvalidTopicError` saying why."""
    if not isinstance(topic, str) or not topic:
        given = "an empty string" if topic == "" else type(topic).__name__
        raise InvalidTopicError(f"topic must be a non-empty string, got {given}", topic=None)
    if len(topic) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(topic)} characters long; Kafka allows {MAX_TOPIC_LENGTH}",
            topic=topic,
        )
    if topic in (".", "..") or topic in INTERNAL_TOPICS:
        raise InvalidTopicError(f"topic name {topic!r} is reserved by Kafka", topic=topic)
    if not _TOPIC_RE.fullmatch(topic):
        raise InvalidTopicError(
            f"topic name {topic!r} has characters Kafka does not allow (use a-z A-Z 0-9 . _ -)",
            topic=topic,
        )
    return topic


@dataclass(frozen=True)
class EventSpec:
    """The routing facts a typed event class declares."""

    topic: str
    event_type: str
    schema_version: int
    key_field: str | None
    aggregate_type: str | None


class Event(BaseModel):
    """Base class for typed events, serialised as JSON.

    Class keywords: ``topic`` (required on concrete classes), ``key`` (name of the field whose
    value is the Kafka message key; or override :meth:`outbox_key`), ``event_type`` (default: the
    class name), ``schema_version`` (default 1), ``aggregate_type`` (default ``None``).
    Override :meth:`outbox_idempotency_key` to derive the key from content (so a retried request
    is recognised as a duplicate), and :meth:`outbox_aggregate_id` when it is not the message key.
    """

    __outbox__: ClassVar[EventSpec | None] = None

    def __init_subclass__(
        cls,
        *,
        topic: str | None = None,
        key: str | None = None,
        event_type: str | None = None,
        schema_version: int | None = None,
        aggregate_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        parent = cls.__outbox__
        topic = topic if topic is not None else (parent.topic if parent else None)
        if topic is None:
            return  # an abstract intermediate class; its subclasses name the topic
        validate_topic(topic)
        if schema_version is not None and (
            not isinstance(schema_version, int) or schema_version < 1
        ):
            raise ConfigurationError(f"{cls.__name__}: schema_version must be a positive int")
        if key is not None and (not isinstance(key, str) or not key):
            raise ConfigurationError(f"{cls.__name__}: key must name a field, got {key!r}")
        cls.__outbox__ = EventSpec(
            topic=topic,
            event_type=event_type or cls.__name__,
            schema_version=schema_version or 1,
            key_field=key if key is not None else (parent.key_field if parent else None),
            aggregate_type=aggregate_type
            if aggregate_type is not None
            else (parent.aggregate_type if parent else None),
        )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """The key field is checked here, once pydantic knows the fields (``__init_subclass__``
        runs before): a misspelt name fails the class definition, not every later write with
        an AttributeError."""
        super().__pydantic_init_subclass__(**kwargs)
        spec = cls.__outbox__
        name = spec.key_field if spec is not None else None
        if name is None or name in cls.model_fields or name in cls.__private_attributes__:
            return
        # A base that leaves its fields to subclasses (each is checked), or one whose instances
        # may carry extra fields, cannot be judged here.
        if not cls.model_fields or cls.model_config.get("extra") == "allow":
            return
        if hasattr(cls, name):  # a property, a computed field, a class attribute
            return
        raise ConfigurationError(
            f"{cls.__name__}: key={name!r} names no field of the event"
            f" (fields: {', '.join(cls.model_fields) or 'none'})"
        )

    @classmethod
    def outbox_spec(cls) -> EventSpec:
        spec = cls.__outbox__
        if spec is None:
            raise ConfigurationError(
                f"{cls.__name__} declares no topic: `class {cls.__name__}(Event, topic=...)`"
            )
        return spec

    def outbox_key(self) -> str | None:
        """The Kafka message key: the declared key field's value, as text."""
        key_field = self.outbox_spec().key_field
        if key_field is None:
            return None
        value = getattr(self, key_field)
        return None if value is None else str(value)

    def outbox_aggregate_id(self) -> str | None:
        return self.outbox_key()

    def outbox_idempotency_key(self) -> str | None:
        """``None`` means "use the event id" (every add is a new event)."""
        return None

    def outbox_payload(self) -> bytes:
        return model_json(self, type(self).__name__)


@dataclass(frozen=True)
class Message:
    """A raw outbox message.

    ``payload``: ``bytes`` (sent as is), ``str`` (UTF-8), a pydantic model, or JSON-able data
    (dict, list, ...). ``content_type`` defaults from the payload's kind.
    """

    topic: str
    payload: Any
    key: str | None = None
    event_type: str | None = None
    schema_version: int | None = None
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    aggregate_type: str | None = None
    aggregate_id: str | None = None
    idempotency_key: str | None = None
    event_id: uuid.UUID | None = None
    deliver_after: datetime | None = None

    @classmethod
    def from_event(
        cls,
        event: Event,
        *,
        idempotency_key: str | None = None,
        event_id: uuid.UUID | None = None,
        headers: dict[str, str] | None = None,
        deliver_after: datetime | None = None,
    ) -> Message:
        """A typed event as a message, with per-write options (idempotency key, headers, ...)."""
        spec = event.outbox_spec()
        return cls(
            topic=spec.topic,
            payload=event,
            key=event.outbox_key(),
            event_type=spec.event_type,
            schema_version=spec.schema_version,
            content_type=JSON_CONTENT_TYPE,
            headers=dict(headers or {}),
            aggregate_type=spec.aggregate_type,
            aggregate_id=event.outbox_aggregate_id(),
            idempotency_key=idempotency_key
            if idempotency_key is not None
            else event.outbox_idempotency_key(),
            event_id=event_id,
            deliver_after=deliver_after,
        )


def _not_json(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _json_encoder() -> Any:
    """Compact JSON text, no NaN. The C encoder is built once: ``JSONEncoder.encode`` builds a
    new one on every call, which cost more than the encoding of a small payload. Without the
    circular-reference markers (a shared dict would not be thread-safe), a cycle ends in a
    RecursionError, refused like any other unserialisable payload."""
    if c_make_encoder is None:  # a Python built without the C accelerator
        return json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
    encode = c_make_encoder(None, _not_json, encode_basestring, None, ":", ",", False, False, False)
    return lambda value: "".join(encode(value, 0))


_json_encode = _json_encoder()


# A model class's serializer writing NaN and Infinity as bare constants, kept on the class itself
# (built at its first write, when pydantic has completed the class; a later forced model_rebuild
# is not seen). On the class, not in a table: the serializer refers to the class, so a table
# would keep classes made at run time (create_model) alive for ever; read from the class's own
# __dict__, so a subclass never takes its parent's.
_LOUD = "__outboxkit_json__"
_CONFIGURED = ("model", "dataclass", "typed-dict")


def _rebuilds_nested() -> bool:
    """Whether this pydantic-core can build nested models' serializers anew (its private
    ``_use_prebuilt``); without it a nested model writes NaN with its own prebuilt serializer,
    as null, and only the outer model's own fields are refused."""
    try:
        SchemaSerializer({"type": "int"}, None, _use_prebuilt=False)
    except TypeError:
        return False
    return True


_NESTED_OPTIONS = {"_use_prebuilt": False} if _rebuilds_nested() else {}
# A bare constant in compact JSON follows ":", "," or "[" (inside a string it cannot: quoted).
_BARE_CONSTANT = re.compile(rb"[:,\[]-?(?:NaN|Infinity)")


def _with_constants(schema: Any) -> Any:
    """A copy of a core schema whose models write NaN/Infinity as bare ``NaN``/``Infinity``
    (pydantic's default writes ``null``: the value silently lost); ``"strings"`` is kept."""
    if isinstance(schema, list):
        return [_with_constants(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    copy = {name: _with_constants(value) for name, value in schema.items()}
    config = copy.get("config")
    if (
        copy.get("type") in _CONFIGURED
        and isinstance(config, dict)
        and config.get("ser_json_inf_nan") != "strings"
    ):
        copy["config"] = {**config, "ser_json_inf_nan": "constants"}
    return copy


def _serializer(cls: type[BaseModel]) -> SchemaSerializer:
    if not cls.__pydantic_complete__:  # forward references (an instance made unvalidated)
        cls.model_rebuild(raise_errors=False)
    if not cls.__pydantic_complete__:  # still incomplete: its own serializer says why
        return cls.__pydantic_serializer__  # not kept: a later write tries again
    loud = SchemaSerializer(
        _with_constants(cls.__pydantic_core_schema__),
        {"ser_json_inf_nan": "constants"},
        **_NESTED_OPTIONS,  # nested models' own serializers would write null
    )
    type.__setattr__(cls, _LOUD, loud)
    return loud


def _no_constant(name: str) -> Any:
    raise ValueError(name)


def model_json(model: BaseModel, what: str = "payload") -> bytes:
    """A pydantic model's JSON (as ``model_dump_json``), refusing NaN and Infinity: JSON has
    neither. Written as bare constants, so the precise check (a parse) runs only on the rare
    output that has those bytes, e.g. inside a string."""
    try:
        cls = type(model)
        data = (cls.__dict__.get(_LOUD) or _serializer(cls)).to_json(model)
    except (PydanticSerializationError, ValueError, TypeError) as exc:
        raise SerializationError(f"{what} could not be serialised: {exc}") from exc
    if (data.find(b"NaN") >= 0 or data.find(b"Infinity") >= 0) and _BARE_CONSTANT.search(data):
        try:
            json.loads(data, parse_constant=_no_constant)
        except ValueError:
            raise SerializationError(
                f"{what} has a NaN or Infinity value, which JSON cannot hold (pydantic would"
                " write null or an invalid token); use None or a string"
            ) from None
    return data


def encode_payload(payload: Any, content_type: str | None = None) -> tuple[bytes, str]:
    """Serialise a payload to bytes and pick its content type (or raise SerializationError)."""
    kind = type(payload)
    if kind is not dict and kind is not list:  # the common raw payloads go straight to JSON
        if isinstance(payload, Event):
            return payload.outbox_payload(), content_type or JSON_CONTENT_TYPE
        if isinstance(payload, bytes | bytearray | memoryview):
            return bytes(payload), content_type or BYTES_CONTENT_TYPE
        if isinstance(payload, str):
            try:
                return payload.encode(), content_type or TEXT_CONTENT_TYPE
            except UnicodeEncodeError as exc:
                raise SerializationError(f"payload is not valid UTF-8 text: {exc}") from exc
        if isinstance(payload, BaseModel):
            return model_json(payload), content_type or JSON_CONTENT_TYPE
    try:
        text = _json_encode(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SerializationError(f"payload is not JSON-serialisable: {exc}") from exc
    check_json_keys(payload)
    try:
        return text.encode(), content_type or JSON_CONTENT_TYPE
    except UnicodeEncodeError as exc:
        raise SerializationError(f"payload has text that is not valid UTF-8: {exc}") from exc
