"""Typed events, raw messages, validation and ids: the pure logic of the writer."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from outboxkit.errors import (
    ConfigurationError,
    IdempotencyKeyConflictError,
    InvalidTopicError,
    OutboxkitError,
    PayloadTooLargeError,
    SerializationError,
    ValidationError,
)
from outboxkit.events import Event, Message, encode_payload, validate_topic
from outboxkit.ids import uuid7, uuid7_time_ms, uuid_text
from outboxkit.limits import DEFAULT_MAX_MESSAGE_BYTES
from outboxkit.outbox_plan import OutboxConfig, Plan, prepare
from outboxkit.schema import notify_channel
from outboxkit.tracing import current_trace_headers
from outboxkit.wire import content_digest

pytestmark = pytest.mark.unit


class OrderPlaced(Event, topic="orders", key="order_id", event_type="order.placed"):
    order_id: str
    total_cents: int


class OrderV2(OrderPlaced, schema_version=2, aggregate_type="order"):
    note: str = ""


class Untyped(Event):
    value: int


class Keyed(Event, topic="things"):
    id: int

    def outbox_key(self) -> str | None:
        return f"thing-{self.id}"

    def outbox_idempotency_key(self) -> str | None:
        return f"create-thing-{self.id}"


def test_event_class_declares_routing() -> None:
    spec = OrderPlaced.outbox_spec()
    assert (spec.topic, spec.event_type, spec.schema_version, spec.key_field) == (
        "orders",
        "order.placed",
        1,
        "order_id",
    )
    event = OrderPlaced(order_id="o-1", total_cents=5)
    assert event.outbox_key() == "o-1"
    assert json.loads(event.outbox_payload()) == {"order_id": "o-1", "total_cents": 5}


def test_subclass_inherits_and_overrides() -> None:
    spec = OrderV2.outbox_spec()
    assert spec.topic == "orders"
    assert spec.key_field == "order_id"
    assert spec.schema_version == 2
    assert spec.aggregate_type == "order"
    assert spec.event_type == "OrderV2"  # the class name when not given


def test_event_without_topic_cannot_be_written() -> None:
    with pytest.raises(ConfigurationError):
        Untyped.outbox_spec()
    with pytest.raises(ValidationError, match="expected an outboxkit Event or Message"):
        prepare({"topic": "x"}, OutboxConfig())  # type: ignore[arg-type]


def test_bad_topic_on_the_class_fails_at_definition() -> None:
    with pytest.raises(InvalidTopicError):

        class Bad(Event, topic="no spaces"):
            x: int


def test_bad_schema_version_fails_at_definition() -> None:
    with pytest.raises(ConfigurationError):

        class Bad(Event, topic="t", schema_version=0):
            x: int


def test_overridden_key_and_idempotency_key() -> None:
    msg = Message.from_event(Keyed(id=3))
    assert msg.key == "thing-3"
    assert msg.aggregate_id == "thing-3"
    assert msg.idempotency_key == "create-thing-3"
    assert Message.from_event(Keyed(id=3), idempotency_key="given").idempotency_key == "given"


@pytest.mark.parametrize("name", ["a", "orders.v1", "A-b_c.9", "x" * 249])
def test_valid_topics(name: str) -> None:
    assert validate_topic(name) == name


@pytest.mark.parametrize(
    "name",
    [
        *("", ".", "..", "x" * 250, "a b", "ü", "a/b", "a:b", None, 3),
        *("__consumer_offsets", "__transaction_state"),
    ],
)
def test_invalid_topics(name: Any) -> None:
    with pytest.raises(InvalidTopicError):
        validate_topic(name)


def test_payload_kinds_and_content_types() -> None:
    assert encode_payload(b"\x00\x01") == (b"\x00\x01", "application/octet-stream")
    assert encode_payload("héllo") == ("héllo".encode(), "text/plain; charset=utf-8")
    assert encode_payload({"a": [1, None]}) == (b'{"a":[1,null]}', "application/json")
    assert encode_payload(b"x", "application/avro")[1] == "application/avro"
    assert encode_payload(OrderPlaced(order_id="1", total_cents=1))[1] == "application/json"


@pytest.mark.parametrize("payload", [{"a": object()}, {"a": float("nan")}, {1j}, "\ud800"])
def test_unserialisable_payloads(payload: Any) -> None:
    with pytest.raises(SerializationError):
        encode_payload(payload)


def test_unserialisable_event_field() -> None:
    class Weird(Event, topic="t"):
        thing: Any

    with pytest.raises(SerializationError):
        prepare(Weird(thing=object()), OutboxConfig())


def test_prepare_fills_ids_digest_and_headers() -> None:
    row = prepare(OrderPlaced(order_id="o-1", total_cents=5), OutboxConfig())
    assert row.event_id.version == 7
    assert row.idempotency_key == str(row.event_id)  # default key: the event id
    assert row.content_digest == content_digest(
        topic="orders",
        key="o-1",
        event_type="order.placed",
        content_type="application/json",
        payload=row.payload,
    )
    assert json.loads(row.headers) == {}


def test_size_counts_payload_key_and_headers() -> None:
    config = OutboxConfig(max_message_bytes=600)
    prepare(Message("t", b"x" * 200), config)
    with pytest.raises(PayloadTooLargeError) as info:
        prepare(Message("t", b"x" * 600), config)
    assert isinstance(info.value, ValidationError)
    assert isinstance(info.value, OutboxkitError)
    assert "OutboxConfig(max_message_bytes=...)" in str(info.value)
    with pytest.raises(PayloadTooLargeError):
        prepare(Message("t", b"x" * 200, key="k" * 300), config)
    with pytest.raises(PayloadTooLargeError):
        prepare(Message("t", b"x" * 200, headers={"h": "v" * 300}), config)
    # A user header named like one of the relay's is replaced by it, not sent twice.
    prepare(Message("t", b"x" * 200, headers={"event-type": "v" * 300}, event_type="e"), config)


# Message("t", payload, key="k"), bytes payload: the record the relay sends carries the key (1),
# the headers event-id (1 + 8 + 1 + 36), idempotency-key (1 + 15 + 1 + 36: the event id) and
# content-type (1 + 12 + 1 + 24: application/octet-stream), and librdkafka's 36 framing bytes.
_FIXED = 1 + 46 + 53 + 38 + 36


def _boundary(size: int) -> Message:
    return Message("t", b"x" * size, key="k")


def test_default_limit_is_the_producers_at_the_byte() -> None:
    assert OutboxConfig().max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES == 1_000_000
    row = prepare(_boundary(1_000_000 - _FIXED), OutboxConfig())
    assert len(row.payload) == 999_826
    with pytest.raises(PayloadTooLargeError) as info:
        prepare(_boundary(1_000_000 - _FIXED + 1), OutboxConfig())
    message = str(info.value)
    assert "1000001-byte Kafka record" in message
    assert "limit is 1000000 bytes: librdkafka's default message.max.bytes" in message
    assert info.value.context == {"size": 1_000_001, "max_message_bytes": 1_000_000}
    # The case from the field: a 1 040 000-byte payload used to pass, then was parked.
    with pytest.raises(PayloadTooLargeError):
        prepare(Message("t", b"x" * 1_040_000), OutboxConfig())


def test_the_limit_agrees_with_librdkafka() -> None:
    """The real producer accepts the largest record the writer lets through, and refuses one
    byte more (librdkafka checks the size in produce(), before any broker is involved)."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": "127.0.0.1:9", "log_level": 0, "message.timeout.ms": 1000}
    )
    row = prepare(_boundary(1_000_000 - _FIXED), OutboxConfig())
    headers = [
        ("event-id", str(row.event_id).encode()),
        ("idempotency-key", row.idempotency_key.encode()),
        ("content-type", row.content_type.encode()),
    ]
    producer.produce("t", value=row.payload, key=b"k", headers=headers)  # accepted
    with pytest.raises(confluent_kafka.KafkaException) as info:
        producer.produce("t", value=row.payload + b"x", key=b"k", headers=headers)
    assert info.value.args[0].code() == confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE
    producer.purge()


def test_headers_must_be_strings() -> None:
    with pytest.raises(SerializationError):
        prepare(Message("t", b"x", headers={"h": 1}), OutboxConfig())  # type: ignore[dict-item]


def test_repeated_key_in_one_call_folds_or_conflicts() -> None:
    same = [prepare(Message("t", b"x", idempotency_key="k"), OutboxConfig()) for _ in range(2)]
    plan = Plan(OutboxConfig(), same)
    assert plan.unique == [0]
    assert plan.first_of == [0, 0]
    other = prepare(Message("t", b"y", idempotency_key="k"), OutboxConfig())
    with pytest.raises(IdempotencyKeyConflictError):
        Plan(OutboxConfig(), [same[0], other])


def test_uuid7_is_time_ordered_and_unique() -> None:
    ids = [uuid7() for _ in range(20_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids[:100])
    import time

    assert abs(uuid7_time_ms(ids[-1]) - time.time() * 1000) < 5_000


def test_uuid7_of_a_forked_child_differs_from_its_parent() -> None:
    """The random pool must not be shared with a forked child (same millisecond and counter
    plus the same random bits would repeat an id)."""
    import os

    uuid7()  # the parent has a filled pool
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        os.write(write_end, b"".join(uuid7().bytes for _ in range(50)))
        os._exit(0)
    os.close(write_end)
    parent_ids = {uuid7().bytes for _ in range(50)}
    data = b""
    while chunk := os.read(read_end, 4096):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    child_ids = {data[i : i + 16] for i in range(0, len(data), 16)}
    assert len(child_ids) == 50
    assert not (child_ids & parent_ids)
    assert {i[6:] for i in child_ids}.isdisjoint({i[6:] for i in parent_ids})


def test_notify_channel() -> None:
    assert notify_channel("outboxkit") == "outboxkit.outbox"
    long = notify_channel("s" * 63)
    assert len(long) <= 63
    assert long != notify_channel("s" * 62)


def test_traceparent_from_the_current_span() -> None:
    assert current_trace_headers() == {}
    ctx = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=False,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1")]),
    )
    with trace.use_span(NonRecordingSpan(ctx)):
        headers = current_trace_headers()
        row = prepare(Message("t", b"x", headers={"user": "h"}), OutboxConfig())
    assert headers == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "vendor=v1",
    }
    assert json.loads(row.headers) == {**headers, "user": "h"}


def test_fast_uuid_construction_and_text_equal_the_standard_ones() -> None:
    for _ in range(2_000):
        made = uuid7()
        standard = uuid.UUID(int=made.int)
        assert made == standard
        assert hash(made) == hash(standard)
        assert made.version == 7
        assert made.is_safe == standard.is_safe
        assert uuid_text(made) == str(standard) == str(made)
        assert uuid_text(standard) == str(standard)
    assert uuid_text(uuid.UUID(int=0)) == "00000000-0000-0000-0000-000000000000"
