"""The writer's cheaper row preparation gives the rows and errors of the plain one."""

from __future__ import annotations

import dataclasses
import enum
import threading
import types
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone, tzinfo

import pytest

from outboxkit.errors import PayloadTooLargeError, SerializationError, ValidationError
from outboxkit.events import Event, Message, encode_payload
from outboxkit.ids import uuid7, uuid7_batch, uuid7_time_ms
from outboxkit.outbox import Outbox, OutboxConfig
from outboxkit.outbox_copy import Stream
from outboxkit.outbox_plan import prepare


class Placed(Event, topic="orders", key="order_id", event_type="order.placed"):
    order_id: str
    total_cents: int


class Keyed(Placed):
    def outbox_idempotency_key(self) -> str | None:
        return f"placed:{self.order_id}"


class BadKey(Placed):
    def outbox_key(self) -> str | None:
        return 42  # type: ignore[return-value]


def test_batched_uuid7s_continue_the_single_ones_in_order() -> None:
    made = [uuid7(), *uuid7_batch(3), uuid7(), *uuid7_batch(5_000), uuid7()]
    assert made == sorted(made)
    assert len(set(made)) == len(made)
    for value in made:
        standard = uuid.UUID(int=value.int)
        assert value == standard
        assert hash(value) == hash(standard)
        assert str(value) == str(standard)
        assert value.version == 7
        assert value.variant == uuid.RFC_4122
    # 5 000 ids overflow the 12-bit counter: it carries into the next milliseconds
    assert uuid7_time_ms(made[-2]) > uuid7_time_ms(made[5])
    assert uuid7_batch(0) == []


def test_batched_uuid7s_stay_ordered_when_the_clock_steps_back() -> None:
    first = uuid7_batch(3)
    past = uuid7_time_ms(first[0]) - 60_000  # the wall clock stepped back a minute
    later = [*uuid7_batch(4, lambda: past * 1_000_000), uuid7(lambda: past * 1_000_000)]
    made = [*first, *later]
    assert made == sorted(made)
    assert len(set(made)) == len(made)


def test_batched_uuid7s_from_threads_are_unique_and_each_thread_increasing() -> None:
    results: list[list[uuid.UUID]] = [[] for _ in range(4)]

    def make(out: list[uuid.UUID]) -> None:
        for n in range(200):
            out.extend(uuid7_batch(1 + n % 7) if n % 3 else [uuid7()])

    threads = [threading.Thread(target=make, args=(out,)) for out in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for out in results:
        assert out == sorted(out)
    every = [value for out in results for value in out]
    assert len(set(every)) == len(every)


def _same_row_but_id(a: object, b: object) -> None:
    assert isinstance(a, tuple)
    assert isinstance(b, tuple)
    assert a[2:] == b[2:]  # everything after event id and (default) idempotency key


@pytest.mark.parametrize(
    "event",
    [Placed(order_id="o-1", total_cents=5), Keyed(order_id="o-2", total_cents=7)],
)
def test_a_typed_event_prepares_as_its_message(event: Placed) -> None:
    config = OutboxConfig()
    direct = prepare(event, config)
    via_message = prepare(Message.from_event(event), config)
    _same_row_but_id(direct, via_message)
    assert (direct.idempotency_key == via_message.idempotency_key) == isinstance(event, Keyed)
    new_id = uuid7()
    assert prepare(event, config, None, new_id).event_id == new_id
    given = uuid7()
    with_id = Message.from_event(event, event_id=given)
    assert prepare(with_id, config, None, new_id).event_id == given


def test_add_options_left_out_prepare_as_none() -> None:
    outbox = Outbox(OutboxConfig())
    when = datetime(2030, 1, 1, tzinfo=UTC)
    for item in (Placed(order_id="o-1", total_cents=5), Message("t", {"a": 1}, key="k")):
        bare = outbox._plan_one(item, None, None, None, None).rows[0]
        _same_row_but_id(bare, prepare(item, OutboxConfig(), idempotency_key=None, headers=None))
        full = outbox._plan_one(item, "key-1", uuid7(), {"h": "v"}, when).rows[0]
        assert (full.idempotency_key, full.headers, full.deliver_after) == (
            "key-1",
            '{"h": "v"}',
            when,
        )


def test_hostile_items_are_refused_as_before() -> None:
    config = OutboxConfig()
    with pytest.raises(ValidationError, match="message key"):
        prepare(BadKey(order_id="o", total_cents=1), config)
    with pytest.raises(ValidationError, match="expected an outboxkit Event or Message"):
        prepare({"topic": "x"}, config)  # type: ignore[arg-type]
    with pytest.raises(SerializationError):
        prepare(Message("t", {"x": float("nan")}), config)
    with pytest.raises(SerializationError):
        prepare(Message("t", [object()]), config)
    with pytest.raises(ValidationError, match="must not be empty"):
        prepare(Message("t", {}, idempotency_key=""), config)
    cyclic: list[object] = []
    cyclic.append(cyclic)
    with pytest.raises(SerializationError):
        encode_payload(cyclic)


def test_dict_and_list_payloads_encode_as_before() -> None:
    assert encode_payload({"b": 1, "a": [1, "é"]}) == (
        '{"b":1,"a":[1,"é"]}'.encode(),
        "application/json",
    )
    assert encode_payload([1, 2], "application/x-list") == (b"[1,2]", "application/x-list")

    class Sub(dict[str, int]):  # not exactly a dict: the general path, same bytes
        pass

    assert encode_payload(Sub(a=1)) == (b'{"a":1}', "application/json")


class _Zone(tzinfo):
    """A caller's time zone whose offset is ``offset`` (a callable: it may raise)."""

    def __init__(self, offset: Callable[[], object]) -> None:
        self.offset = offset

    def utcoffset(self, dt: datetime | None) -> timedelta:
        return self.offset()  # type: ignore[return-value]

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None


def _raise() -> object:
    raise RuntimeError("the zone database is gone")


def _at(zone: tzinfo, year: int = 2030) -> datetime:
    return datetime(year, 1, 1, tzinfo=zone)


NAN = float("nan")

HOSTILE_FIELDS: list[tuple[str, dict[str, object], str]] = [
    # What a consumer refuses on arrival (outboxkit.wire.header_problem): refused at the write.
    ("1025-byte idempotency key", {"idempotency_key": "k" * 1025}, "1025 bytes"),
    ("tab in idempotency key", {"idempotency_key": "order\t42"}, "control characters"),
    ("no-break space in key", {"idempotency_key": "a\u00a0b"}, "control characters"),
    ("256-byte event type", {"event_type": "e" * 256}, "256 bytes"),
    ("newline in event type", {"event_type": "order.placed\n"}, "control characters"),
    # What PostgreSQL cannot store (NUL in text and jsonb), or an integer column cannot hold.
    ("NUL in key", {"key": "a\x00b"}, "NUL"),
    ("NUL in aggregate id", {"aggregate_id": "x\x00"}, "NUL"),
    ("NUL in aggregate type", {"aggregate_type": "x\x00"}, "NUL"),
    ("NUL in content type", {"content_type": "application/x\x00", "payload": b"{}"}, "NUL"),
    ("NUL in a header", {"headers": {"a": "b\x00"}}, "NUL"),
    ("schema version 2**40", {"schema_version": 2**40}, "from 1 to 2147483647"),
    ("schema version 0", {"schema_version": 0}, "from 1 to 2147483647"),
    ("schema version 1.5", {"schema_version": 1.5}, "from 1 to 2147483647"),
    ("schema version True", {"schema_version": True}, "from 1 to 2147483647"),
    # Types and text a driver would fail on with an untyped error.
    ("topic with a final newline", {"topic": "orders\n"}, "topic"),
    ("lone surrogate in key", {"key": "\ud800"}, "lone surrogate"),
    ("lone surrogate in a header", {"headers": {"a": "\ud800"}}, "lone surrogate"),
    ("event id as text", {"event_id": "0190a3c4-0000-7000-8000-000000000000"}, "uuid.UUID"),
    ("idempotency key as int", {"idempotency_key": 5}, "must be a str"),
    ("idempotency key as bytes", {"idempotency_key": b"abc"}, "must be a str"),
    ("aggregate id as int", {"aggregate_id": 5}, "must be a str"),
    ("aggregate id 0", {"aggregate_id": 0}, "must be a str"),
    ("deliver_after 0", {"deliver_after": 0}, "timezone-aware"),
    ("headers as a list", {"headers": [("a", "b")]}, "headers must map"),
    ("deliver_after as text", {"deliver_after": "tomorrow"}, "timezone-aware"),
    ("naive deliver_after", {"deliver_after": datetime(2030, 1, 1)}, "timezone-aware"),
    # A caller's tzinfo is the caller's code: asked once, its failure names the field.
    ("tzinfo raising", {"deliver_after": _at(_Zone(_raise))}, "deliver_after .*RuntimeError"),
    ("offset an int", {"deliver_after": _at(_Zone(lambda: 5))}, "deliver_after .*TypeError"),
    ("offset of a day", {"deliver_after": _at(_Zone(lambda: timedelta(1)))}, "deliver_after"),
    (  # no UTC form in Python, an offset PostgreSQL's text form cannot carry
        "year 1 at +20:00",
        {"deliver_after": _at(timezone(timedelta(hours=20)), year=1)},
        "deliver_after .*PostgreSQL",
    ),
    # What JSON would lose: keys written alike.
    ("keys 1 and '1'", {"payload": {"a": {1: "x", "1": "y"}}}, r"payload\[str key\] has keys of"),
    # A key the parked rows' index could not hold (the row could never be parked).
    ("1025-byte key", {"key": "k" * 1025}, "1025 bytes in UTF-8"),
    ("key of 513 two-byte characters", {"key": "é" * 513}, "1026 bytes in UTF-8"),
    # Headers named like the relay's: sent as given when no column replaces them.
    ("event-type header with a tab", {"headers": {"event-type": "a\tb"}}, "control characters"),
    ("256-byte event-type header", {"headers": {"event-type": "e" * 256}}, "256 bytes"),
    ("2 MB aggregate-id header", {"headers": {"aggregate-id": "x" * 2_000_000}}, "Kafka record"),
    ("lone surrogate in aggregate-id", {"headers": {"aggregate-id": "\ud800"}}, "lone surrogate"),
    # ... and stored even when the relay replaces them.
    ("lone surrogate in event-id", {"headers": {"event-id": "\ud800"}}, "lone surrogate"),
]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [pytest.param(f, p, id=name) for name, f, p in HOSTILE_FIELDS],
)
def test_hostile_fields_are_refused_typed_on_every_path(
    fields: dict[str, object], problem: str
) -> None:
    """One refusal, before any SQL, whichever path the item takes: add (one row), add_many
    below the COPY threshold (rows bound as arrays) and above it (the COPY stream)."""
    item = Message(**{"topic": "orders", "payload": {"a": 1}, **fields})  # type: ignore[arg-type]
    config = OutboxConfig()
    with pytest.raises(ValidationError, match=problem):
        prepare(item, config)
    with pytest.raises(ValidationError, match=problem):
        Outbox(config)._plan_many([Message("orders", {"a": 0}), item])
    stream = Stream([Message("orders", {"a": 0})] * 150 + [item], config, {}, 1, range(151))
    with pytest.raises(ValidationError, match=problem):
        list(stream)


def test_fields_at_their_limits_are_taken() -> None:
    item = Message(
        "orders",
        {"a": 1},
        idempotency_key="k" * 1024,
        event_type="e" * 255,
        schema_version=2**31 - 1,
        aggregate_id="agg-1",
        headers={"traceparent": "00-abc"},
        deliver_after=datetime(2030, 1, 1, tzinfo=UTC),
    )
    row = prepare(item, OutboxConfig())
    assert (row.idempotency_key, row.event_type) == ("k" * 1024, "e" * 255)
    assert row.schema_version == 2**31 - 1
    assert prepare(Message("orders", {}, headers=None), OutboxConfig()).headers == "{}"  # type: ignore[arg-type]


class Kind(enum.StrEnum):
    PLACED = "order.placed"


class Version(enum.IntEnum):
    V2 = 2


class ByEnum(Event, topic="orders", event_type=Kind.PLACED, schema_version=Version.V2):
    order_id: str


def test_enum_members_are_taken_as_their_values() -> None:
    """A StrEnum event type or key and an IntEnum schema version, as many codebases declare
    them, are written as their plain text and number."""
    row = prepare(ByEnum(order_id="o"), OutboxConfig())
    assert (type(row.event_type), row.event_type) == (str, "order.placed")
    assert (type(row.schema_version), row.schema_version) == (int, 2)
    message = Message("orders", {}, idempotency_key=Kind.PLACED, event_type=Kind.PLACED)
    row = prepare(message, OutboxConfig())
    assert (type(row.idempotency_key), row.idempotency_key) == (str, "order.placed")


def test_keys_are_limited_in_utf8_bytes() -> None:
    """1024 bytes, whatever the characters; a typed event's key as a raw message's."""
    config = OutboxConfig()
    for key in ("k" * 1024, "é" * 512, "\U0001f600" * 256):
        assert prepare(Message("t", b"", key=key), config).message_key == key
    for key in ("k" * 1025, "é" * 513, "\U0001f600" * 257):
        with pytest.raises(ValidationError, match="limit 1024"):
            prepare(Message("t", b"", key=key), config)
    with pytest.raises(ValidationError, match="message key is 1025 bytes"):
        prepare(Placed(order_id="o" * 1025, total_cents=1), config)


@pytest.mark.parametrize("name", ["event-type", "schema-version", "aggregate-type", "aggregate-id"])
def test_a_relay_named_header_counts_unless_its_column_replaces_it(name: str) -> None:
    """The relay sends such a header as given when the row has no value for its column: it
    counts as any other header then, and not at all when the column's value replaces it."""
    config = OutboxConfig(max_message_bytes=1_000)
    value = "v" * 200
    columns = {"event_type": "e", "schema_version": 1, "aggregate_type": "a", "aggregate_id": "a"}
    column = name.replace("-", "_")
    bare = Message("t", b"x" * 700, event_type="e")  # a column set, with none of the headers

    def largest(**fields: object) -> int:
        """The largest payload the writer takes with these fields."""
        for n in range(700, -1, -1):
            try:
                prepare(dataclasses.replace(bare, payload=b"x" * n, **fields), config)
            except PayloadTooLargeError:
                continue
            return n
        raise AssertionError("nothing fits")

    others = {k: v for k, v in columns.items() if k != column}
    # same size as a header of another name (and length): it travels
    sent = largest(headers={name: value}, **{**others, column: None})
    assert sent == largest(headers={"x" * len(name): value}, **{**others, column: None})
    # replaced by the column's value: only that one counts
    assert largest(headers={name: value}, **columns) == largest(**columns)
    if name == "event-type":  # a replaced one is not checked as an identity header either
        prepare(Message("t", b"", headers={name: "a\tb"}, event_type="e"), config)


def test_headers_in_any_mapping_are_taken() -> None:
    """A read-only mapping (mappingproxy) or another Mapping: json.dumps takes only dicts."""
    config = OutboxConfig()
    for headers in (types.MappingProxyType({"h": "v"}), _Headers()):
        item = Message("orders", {"a": 1}, headers=headers)  # type: ignore[arg-type]
        assert prepare(item, config).headers == '{"h": "v"}'
        assert Outbox(config)._plan_many([item]).rows[0].headers == '{"h": "v"}'
        stream = Stream([item] * 151, config, {}, 1, range(151))
        assert {row[7] for row in stream} == {'{"h": "v"}'}


class _Headers(Mapping[str, str]):
    def __getitem__(self, name: str) -> str:
        if name != "h":
            raise KeyError(name)
        return "v"

    def __iter__(self) -> Iterator[str]:
        return iter(("h",))

    def __len__(self) -> int:
        return 1


def _sent(when: datetime) -> datetime | None:
    """``deliver_after`` as every path sends it (the row's value)."""
    return prepare(Message("t", b"x", deliver_after=when), OutboxConfig()).deliver_after


@pytest.mark.parametrize(
    "offset",
    [timedelta(hours=20), -timedelta(hours=16, minutes=30), timedelta(seconds=3600.5), timedelta()],
)
def test_deliver_after_is_sent_as_the_same_instant_in_utc(offset: timedelta) -> None:
    """COPY sends text, local time and offset, and PostgreSQL reads no offset beyond +-15:59
    nor one with fractional seconds, which Python allows: every path sends UTC."""
    when = datetime(2030, 1, 1, tzinfo=timezone(offset))
    sent = _sent(when)
    assert sent == when
    assert sent is not None
    assert sent.tzinfo is UTC


def test_a_deliver_after_without_a_utc_form_keeps_its_offset() -> None:
    """Within a day of datetime's range Python cannot convert it; PostgreSQL reads it (its
    offset is within +-15:59), as a fixed offset: the caller's tzinfo is not asked again."""
    when = datetime(1, 1, 1, tzinfo=_Zone(lambda: timedelta(hours=10)))
    sent = _sent(when)
    assert sent == when
    assert sent is not None
    assert sent.tzinfo == timezone(timedelta(hours=10))


def test_the_callers_tzinfo_is_asked_once() -> None:
    """A tzinfo that answers once and then fails (or answers otherwise) cannot make the row
    differ from what was checked: the row holds UTC."""
    answers = iter([timedelta(hours=2)])
    sent = _sent(datetime(2030, 1, 1, 12, tzinfo=_Zone(lambda: next(answers))))
    assert sent == datetime(2030, 1, 1, 10, tzinfo=UTC)


class _Falsy(_Zone):
    def __bool__(self) -> bool:
        return False


def test_a_false_tzinfo_is_not_taken_for_none() -> None:
    """psycopg tests ``if obj.tzinfo``: with a false one the INSERT failed with a bare
    TypeError (naive minus aware)."""
    sent = _sent(datetime(2030, 1, 1, 12, tzinfo=_Falsy(lambda: timedelta(hours=2))))
    assert sent == datetime(2030, 1, 1, 10, tzinfo=UTC)
    assert sent is not None
    assert sent.tzinfo is UTC
