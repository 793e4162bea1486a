"""Pure logic of the inbox middleware: identity, decoding, back-off, retry gate, outcomes."""

from __future__ import annotations

import json

import pydantic
import pytest

from outboxkit.errors import (
    ConfigurationError,
    DecodeError,
    LeaseLostError,
    MissingEventIdError,
    UnknownEventTypeError,
)
from outboxkit.events import Event
from outboxkit.inbox import Envelope, EventRegistry, InboxSettings, OutcomeKind, RetryPolicy
from outboxkit.inbox.acks import ack_record
from outboxkit.inbox.context import HandlerContext
from outboxkit.inbox.deadletter import dead_letter_headers, dead_letter_topic, record_size
from outboxkit.inbox.envelope import identify
from outboxkit.inbox.gate import PartitionGate
from outboxkit.inbox.offsets import PendingOffsets
from outboxkit.inbox.outcome import Outcome

pytestmark = pytest.mark.unit


class Shipped(pydantic.BaseModel):
    order_id: str
    parcels: int


def _env(
    headers: list[tuple[str, bytes | None]] | None = None,
    value: bytes = b'{"order_id": "o1", "parcels": 2}',
    **kw: object,
) -> Envelope:
    parts: dict[str, object] = {
        "topic": "orders",
        "partition": 0,
        "offset": 7,
        "key": b"o1",
        "value": value,
        "headers": headers if headers is not None else [("event-id", b"e1")],
        "timestamp_ms": None,
    }
    parts.update(kw)
    return Envelope.from_parts(**parts)  # type: ignore[arg-type]


def test_identity_reads_headers_and_defaults_key_to_event_id() -> None:
    ident = identify(_env([("event-id", b"e1"), ("event-type", b"order.shipped")]))
    assert (ident.event_id, ident.idempotency_key, ident.event_type) == (
        "e1",
        "e1",
        "order.shipped",
    )
    assert ident.content_type == "application/json"
    explicit = identify(_env([("event-id", b"e1"), ("idempotency-key", b"k-9")]))
    assert explicit.idempotency_key == "k-9"


def test_digest_ignores_trace_headers_but_not_payload() -> None:
    base = identify(_env([("event-id", b"e1"), ("traceparent", b"00-a-b-01")]))
    retraced = identify(_env([("event-id", b"e1"), ("traceparent", b"00-c-d-01")]))
    changed = identify(_env([("event-id", b"e1")], value=b'{"order_id": "o1", "parcels": 3}'))
    assert base.digest == retraced.digest
    assert base.digest != changed.digest


def test_missing_event_id_is_rejected_unless_a_callable_supplies_it() -> None:
    with pytest.raises(MissingEventIdError):
        identify(_env([]))
    with pytest.raises(MissingEventIdError):
        identify(_env([("event-id", b"")]))
    ident = identify(_env([]), event_id_from=lambda env: json.loads(env.value or b"")["order_id"])
    assert ident.event_id == "o1"


def test_a_failing_event_id_from_is_the_record_s_decode_error() -> None:
    def raises(env: Envelope) -> str:
        raise KeyError("order_id")

    with pytest.raises(DecodeError, match="event_id_from raised KeyError: 'order_id'"):
        identify(_env([]), event_id_from=raises)
    with pytest.raises(DecodeError, match="event_id_from returned int, not str or None"):
        identify(_env([]), event_id_from=lambda env: 7)  # type: ignore[arg-type,return-value]
    with pytest.raises(MissingEventIdError):
        identify(_env([]), event_id_from=lambda env: None)


def test_registry_decodes_typed_events_and_explains_failures() -> None:
    registry = EventRegistry()
    assert registry.register(Shipped, event_type="order.shipped") == "order.shipped"
    event = registry.decode("order.shipped", "application/json", b'{"order_id":"x","parcels":1}')
    assert event == Shipped(order_id="x", parcels=1)
    with pytest.raises(UnknownEventTypeError, match="unknown event type 'nope'"):
        registry.decode("nope", "application/json", b"{}")
    with pytest.raises(UnknownEventTypeError, match="no event-type"):
        registry.decode(None, "application/json", b"{}")
    with pytest.raises(DecodeError, match=r"not a valid 'order\.shipped'"):
        registry.decode("order.shipped", "application/json", b"\xff\x00garbage")
    with pytest.raises(DecodeError, match="unsupported content type"):
        registry.decode("order.shipped", "application/avro", b"{}")
    with pytest.raises(ConfigurationError, match="already registered"):
        registry.register(pydantic.create_model("Other", x=(int, 0)), event_type="order.shipped")
    with pytest.raises(ConfigurationError, match="declares no event type"):
        registry.register(pydantic.create_model("Plain", x=(int, 0)))


class Cancelled(Event, topic="orders", event_type="order.cancelled"):
    order_id: str


def test_registry_takes_the_type_from_the_event_class_and_binds_handlers() -> None:
    registry = EventRegistry()
    registry.register(Cancelled)
    assert registry.event_types == frozenset({"order.cancelled"})
    assert registry.decode("order.cancelled", "application/json", b'{"order_id":"z"}') == (
        Cancelled(order_id="z")
    )

    @registry.handler(Shipped, event_type="order.shipped")
    def ship(event: Shipped, ctx: HandlerContext, session: object) -> None: ...

    assert registry.handler_for("order.shipped") is ship
    assert registry.handler_for("order.cancelled") is None
    with pytest.raises(ConfigurationError, match="already has a handler"):
        registry.handler(Shipped, event_type="order.shipped")(lambda *a: None)
    registry.check_handlers(coroutines=False, fallback=None)
    with pytest.raises(ConfigurationError, match="must be async"):
        registry.check_handlers(coroutines=True, fallback=None)


def test_retry_policy_is_bounded_and_exponential() -> None:
    policy = RetryPolicy(max_attempts=4, initial_delay=0.5, multiplier=2, max_delay=3)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert [policy.exhausted(n) for n in (1, 3, 4, 5)] == [False, False, True, True]
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


def test_gate_holds_a_partition_until_due_and_the_failed_offset_returns() -> None:
    gate = PartitionGate()
    gate.hold(("t", 0), 5, due=10.0)
    assert gate.accept(("t", 1), 3)  # other partitions flow
    assert not gate.accept(("t", 0), 6)  # prefetched later message: dropped, seek re-delivers
    assert gate.due(9.0) == []
    assert gate.next_due() == 10.0
    assert gate.due(10.0) == [(("t", 0), 5)]
    assert gate.due(11.0) == []  # resumed once
    assert not gate.accept(("t", 0), 4)  # before the failed offset: still waiting
    assert gate.accept(("t", 0), 5)
    assert gate.accept(("t", 0), 6)  # released
    gate.hold(("t", 0), 8, due=1.0)
    gate.forget([("t", 0)])
    assert gate.held == frozenset()


def test_a_resumed_hold_ends_at_a_later_offset_when_the_failed_one_left_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Retention or ``delete_records`` removed the failed record while it was held: after the
    seek Kafka resumes at its first offset, past the held one. Waiting for the held offset
    would drop every record of the partition from then on."""
    gate = PartitionGate()
    gate.hold(("t", 0), 5, due=10.0)
    assert not any(gate.accept(("t", 0), o) for o in (5, 7, 9))  # not resumed: all dropped
    assert gate.due(10.0) == [(("t", 0), 5)]
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        assert gate.accept(("t", 0), 7)
    assert gate.held == frozenset()
    assert gate.accept(("t", 0), 8)
    assert [r.getMessage() for r in caplog.records] == [
        "t/0: held record at offset 5 is gone; resuming at 7"
    ]


def test_only_settled_outcomes_advance_the_offset() -> None:
    advancing = {k for k in OutcomeKind if k.advances_offset}
    assert advancing == {
        OutcomeKind.SUCCEEDED,
        OutcomeKind.DUPLICATE,
        OutcomeKind.REJECTED,
        OutcomeKind.DEAD,
        OutcomeKind.CANCELLED,
    }


def test_replay_window_judges_kafka_timestamps() -> None:
    settings = InboxSettings(consumer="c", registry=EventRegistry(), replay_window=3600)
    assert settings.too_old(_env(timestamp_ms=1_000_000), now=1_000 + 3601)
    assert not settings.too_old(_env(timestamp_ms=1_000_000), now=1_000 + 3599)
    assert not settings.too_old(_env(timestamp_ms=None), now=10**9)
    no_window = InboxSettings(consumer="c", registry=EventRegistry())
    assert not no_window.too_old(_env(timestamp_ms=1), now=10**9)


def test_dead_letter_topic_and_headers() -> None:
    assert dead_letter_topic("{topic}.dlq", "orders") == "orders.dlq"
    assert dead_letter_topic("all-dead", "orders") == "all-dead"
    assert dead_letter_topic(lambda t: t.upper(), "orders") == "ORDERS"
    headers = dict(
        dead_letter_headers(
            _env([("event-id", b"e1"), ("dlq-error", b"spoofed")]),
            consumer="billing",
            event_id="e1",
            error="RuntimeError: no",
            attempts=3,
        )
    )
    assert headers["dlq-error"] == b"RuntimeError: no"
    assert headers["dlq-attempts"] == b"3"
    assert headers["dlq-source"] == b"orders/0/7"
    assert headers["event-id"] == b"e1"


def test_dead_letter_headers_keep_the_longest_prefix_of_many_headers_that_fits() -> None:
    """A record may carry a great many tiny headers: the trim keeps the longest prefix of the
    original headers that fits (found here by bisection over the record size)."""
    many = [("event-id", b"e1")] + [(f"h{n}", b"v" * (n % 7)) for n in range(50_000)]
    env = _env(many)  # type: ignore[arg-type]
    for max_bytes in (2_000, 100_000, 400_000, 10_000_000):
        got = dead_letter_headers(
            env, consumer="c", event_id="e1", error="E", attempts=1, max_bytes=max_bytes
        )
        kept, ours = got[:-5], got[-5:]
        assert ours[0][0] == "dlq-event-id"

        def fits(k: int, ours: list[tuple[str, bytes]] = ours, limit: int = max_bytes) -> bool:
            return record_size(env.key, env.value, many[:k] + ours) <= limit

        low, high = 0, len(many)  # the largest k with fits(k)
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(middle) else (low, middle - 1)
        assert kept == many[:low]


def test_context_check_raises_once_the_lease_is_lost() -> None:
    reason: list[str] = []
    ctx = HandlerContext(
        consumer="c",
        event_id="e1",
        idempotency_key="k",
        event_type=None,
        headers={},
        attempt=1,
        topic="t",
        partition=0,
        offset=0,
        lease_token=1,
        _lost_reason=lambda: reason[0] if reason else None,
    )
    ctx.check()
    assert not ctx.lease_lost
    reason.append("partition revoked")
    assert ctx.lease_lost
    with pytest.raises(LeaseLostError, match="partition revoked"):
        ctx.check()


def test_ack_records_only_for_outcomes_this_delivery_decided() -> None:
    env = _env()
    key, value, headers = ack_record(
        "billing", env, Outcome(OutcomeKind.DEAD, "e1", attempts=3, error="boom")
    ) or (b"", b"", [])
    assert key == b"e1"
    assert json.loads(value) == {
        "consumer": "billing",
        "event_id": "e1",
        "state": "dead",
        "attempts": 3,
        "error": "boom",
        "topic": "orders",
        "partition": 0,
        "offset": 7,
    }
    assert ("event-id", b"e1") in headers
    assert ack_record("billing", env, Outcome(OutcomeKind.DUPLICATE, "e1")) is None
    assert ack_record("billing", env, Outcome(OutcomeKind.RETRY, "e1")) is None
    assert ack_record("billing", env, Outcome(OutcomeKind.REJECTED, None, error="no id")) is None


def test_pending_offsets_commit_on_interval_and_per_partition() -> None:
    pending = PendingOffsets(interval=5.0, now=100.0)
    pending.settle(("t", 0), 4)
    pending.settle(("t", 0), 3)  # never moves backwards
    pending.settle(("t", 1), 9)
    assert pending.due(104.0) == {}
    assert pending.take([("t", 1), ("t", 7)]) == {("t", 1): 9}
    assert pending.due(105.0) == {("t", 0): 4}
    assert pending.due(106.0) == {}
    pending.settle(("t", 0), 5)
    assert pending.due(109.0) == {}
    assert pending.due(110.0) == {("t", 0): 5}
