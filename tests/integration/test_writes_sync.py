"""Writes on a SQLAlchemy Session/Connection against the real PostgreSQL."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from outboxkit.db import migrator, sqlalchemy_url
from outboxkit.errors import (
    IdempotencyKeyConflictError,
    InvalidTopicError,
    PayloadTooLargeError,
    SerializationError,
)
from outboxkit.events import Event, Message
from outboxkit.outbox import Outbox
from outboxkit.schema import notify_channel
from outboxkit.testing import assert_not_outboxed, assert_outboxed, outboxed

_OUTBOX = Outbox()  # the default configuration (schema "outboxkit")
add = _OUTBOX.add
add_many = _OUTBOX.add_many

pytestmark = pytest.mark.integration


class OrderPlaced(Event, topic="orders", key="order_id", event_type="order.placed"):
    order_id: str
    total_cents: int


@pytest.fixture
def engine(sa_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(sa_url)
    with eng.begin() as conn:
        conn.execute(sa.text("CREATE TABLE app_order (id text PRIMARY KEY, status text)"))
    yield eng
    eng.dispose()


def rows(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(sa.text("SELECT * FROM outboxkit.outbox_message ORDER BY id")).mappings()
        )


def test_committed_transaction_leaves_exactly_its_rows(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        session.execute(sa.text("INSERT INTO app_order VALUES ('o-1', 'placed')"))
        result = add(session, OrderPlaced(order_id="o-1", total_cents=500))
        assert not result.duplicate
    found = rows(engine)
    assert len(found) == 1
    row = found[0]
    assert row["event_id"] == result.event_id
    assert row["id"] == result.id
    assert row["topic"] == "orders"
    assert row["message_key"] == "o-1"
    assert row["event_type"] == "order.placed"
    assert row["schema_version"] == 1
    assert row["aggregate_id"] == "o-1"
    assert row["content_type"] == "application/json"
    assert json.loads(bytes(row["payload"])) == {"order_id": "o-1", "total_cents": 500}
    assert row["idempotency_key"] == str(result.event_id)
    assert row["state"] == "pending"
    assert row["shard"] == 0


def test_rolled_back_transaction_leaves_nothing(engine: sa.Engine) -> None:
    with Session(engine) as session:
        session.execute(sa.text("INSERT INTO app_order VALUES ('o-1', 'placed')"))
        add(session, OrderPlaced(order_id="o-1", total_cents=500))
        add_many(session, [Message("audit", {"n": i}) for i in range(5)])
        assert len(outboxed(session)) == 6  # visible inside the transaction ...
        session.rollback()
    assert rows(engine) == []  # ... and gone with it
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM app_order")).scalar() == 0


def test_writer_never_commits(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        add(conn, Message("t", b"x"))
        assert conn.in_transaction()
        conn.rollback()
    assert rows(engine) == []


def test_raw_messages_and_options(engine: sa.Engine) -> None:
    event_id = uuid.uuid4()
    with engine.begin() as conn:
        add(
            conn,
            Message("raw", b"\x00\xff", key="k", event_type="blob", aggregate_type="thing"),
            event_id=event_id,
            idempotency_key="raw-1",
            headers={"x-tenant": "acme"},
            deliver_after=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
        )
        add(conn, Message("text", "héllo", content_type="text/x-custom"))
    first, second = rows(engine)
    assert first["event_id"] == event_id
    assert first["idempotency_key"] == "raw-1"
    assert bytes(first["payload"]) == b"\x00\xff"
    assert first["content_type"] == "application/octet-stream"
    assert first["headers"] == {"x-tenant": "acme"}
    assert first["aggregate_type"] == "thing"
    assert first["deliver_after"] == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert second["deliver_after"] is None
    assert bytes(second["payload"]) == "héllo".encode()
    assert second["content_type"] == "text/x-custom"


def test_same_key_same_content_is_a_duplicate(engine: sa.Engine) -> None:
    event = OrderPlaced(order_id="o-1", total_cents=500)
    with Session(engine) as session, session.begin():
        first = add(session, event, idempotency_key="place-o-1")
    with Session(engine) as session, session.begin():
        again = add(session, event, idempotency_key="place-o-1")
    assert again.duplicate
    assert again.event_id == first.event_id
    assert again.id is None
    assert len(rows(engine)) == 1


def test_same_key_other_content_conflicts_and_transaction_stays_usable(
    engine: sa.Engine,
) -> None:
    with engine.begin() as conn:
        add(conn, OrderPlaced(order_id="o-1", total_cents=500), idempotency_key="k")
    with engine.connect() as conn:
        with pytest.raises(IdempotencyKeyConflictError) as info:
            add(conn, OrderPlaced(order_id="o-1", total_cents=999), idempotency_key="k")
        assert info.value.context["existing_event_id"] == rows(engine)[0]["event_id"]
        add(conn, Message("t", b"later"))  # the caller's transaction is not aborted
        conn.commit()
    assert len(rows(engine)) == 2


@pytest.mark.parametrize(
    ("copy_min_rows", "expected"),
    [
        (None, ["SAVEPOINT", "INSERT", "RELEASE"]),
        # the COPY path: its table lock (an INSERT of no row), the shard count, the COPY
        (300, ["SAVEPOINT", "INSERT INTO", "SELECT shard_count", "SELECT s.shard", "RELEASE"]),
    ],
)
def test_add_many_one_statement_in_a_savepoint_in_order(
    engine: sa.Engine, copy_min_rows: int | None, expected: list[str]
) -> None:
    statements: list[str] = []

    class CountingCursor(psycopg.Cursor[Any]):
        """Counts what reaches the driver, whichever way it is sent (COPY is not an execute)."""

        def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
            statements.append(bytes(query).decode())
            return super().execute(query, params, **kw)

    outbox = Outbox(copy_min_rows=copy_min_rows)
    events = [OrderPlaced(order_id=f"o-{i % 7}", total_cents=i) for i in range(300)]
    with engine.begin() as conn:
        raw = conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        original = raw.cursor_factory
        raw.cursor_factory = CountingCursor
        try:
            results = outbox.add_many(conn, events)
        finally:
            raw.cursor_factory = original
    assert [s for s in statements if not any(s.startswith(e) for e in expected)] == []
    assert len(statements) == len(expected)
    assert [r.duplicate for r in results] == [False] * 300
    found = rows(engine)
    assert [(r["id"], r["event_id"]) for r in found] == [(r.id, r.event_id) for r in results]
    assert [json.loads(bytes(r["payload"]))["total_cents"] for r in found] == list(range(300))


def test_add_many_duplicates_within_and_across_calls(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        (existing,) = add_many(conn, [Message("t", {"v": 1}, idempotency_key="a")])
    with engine.begin() as conn:
        results = add_many(
            conn,
            [
                Message("t", {"v": 2}, idempotency_key="b"),
                Message("t", {"v": 1}, idempotency_key="a"),  # already in the table
                Message("t", {"v": 2}, idempotency_key="b"),  # repeat within this call
                Message("t", {"v": 3}),
            ],
        )
    assert [r.duplicate for r in results] == [False, True, True, False]
    assert results[1].event_id == existing.event_id
    assert results[2].event_id == results[0].event_id
    assert len(rows(engine)) == 3


def test_add_many_conflict_writes_nothing_of_the_call(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        add(conn, Message("t", {"v": 1}), idempotency_key="a")
    with engine.connect() as conn:
        add(conn, Message("t", {"v": 0}), idempotency_key="before")  # the caller's own row
        with pytest.raises(IdempotencyKeyConflictError):
            add_many(
                conn,
                [
                    Message("t", {"v": 9}, idempotency_key="new-1"),
                    Message("t", {"v": 2}, idempotency_key="a"),  # other content
                    Message("t", {"v": 9}, idempotency_key="new-2"),
                ],
            )
        # Rolled back to the call's savepoint: its rows are gone, the caller's row stays, and
        # the transaction goes on (new-1 is free again).
        assert [m.idempotency_key for m in outboxed(conn)] == ["a", "before"]
        add_many(conn, [Message("t", {"v": 9}, idempotency_key="new-1"), Message("t", b"x")])
        conn.rollback()
    with engine.connect() as conn, pytest.raises(IdempotencyKeyConflictError):
        add_many(
            conn, [Message("t", b"1", idempotency_key="x"), Message("t", b"2", idempotency_key="x")]
        )
    assert [r["idempotency_key"] for r in rows(engine)] == ["a"]


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message("t", b"x" * 2_000), PayloadTooLargeError),
        (Message("bad topic", b"x"), InvalidTopicError),
        (Message("", b"x"), InvalidTopicError),
        (Message("t", {"when": object()}), SerializationError),
    ],
)
def test_validation_errors_write_nothing(engine: sa.Engine, message: Message, error: type) -> None:
    outbox = Outbox(max_message_bytes=1_000)
    with engine.connect() as conn:
        conn.execute(sa.text("INSERT INTO app_order VALUES ('o-1', 'placed')"))
        with pytest.raises(error):
            outbox.add(conn, message)
        with pytest.raises(error):
            outbox.add_many(conn, [Message("t", b"fine"), message])
        outbox.add(conn, Message("t", b"fine"))  # the transaction is still usable
        conn.commit()
    assert [bytes(r["payload"]) for r in rows(engine)] == [b"fine"]


def test_shard_is_computed_by_the_database(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outboxkit.outbox_setting SET shard_count = 8"))
    with engine.begin() as conn:
        add_many(conn, [Message("t", b"x", key=f"k{i}") for i in range(50)])
        add(conn, Message("t", b"x"))
    with engine.connect() as conn:
        mismatched = conn.execute(
            sa.text(
                "SELECT count(*) FROM outboxkit.outbox_message"
                " WHERE shard <> outboxkit.outbox_shard(message_key, event_id, 8)"
            )
        ).scalar()
        shards = conn.execute(
            sa.text("SELECT count(DISTINCT shard) FROM outboxkit.outbox_message")
        ).scalar()
    assert mismatched == 0
    assert shards is not None
    assert shards > 1


def test_custom_schema(outboxkit_empty_db_url: str) -> None:
    migrator.upgrade(outboxkit_empty_db_url, schema="billing_outbox")
    eng = sa.create_engine(sqlalchemy_url(outboxkit_empty_db_url))
    try:
        outbox = Outbox(schema="billing_outbox")
        with eng.begin() as conn:
            outbox.add(conn, Message("t", b"x"))
            assert_outboxed(conn, topic="t", count=1, schema="billing_outbox")
    finally:
        eng.dispose()


def _drain(listener: psycopg.Connection, wait_s: float) -> list[tuple[str, str]]:
    got = []
    for n in listener.notifies(timeout=wait_s, stop_after=None):
        got.append((n.channel, n.payload))
    return got


def _notifications(listener: psycopg.Connection, count: int, deadline_s: float = 30.0) -> list[Any]:
    got: list[Any] = []
    end = time.monotonic() + deadline_s
    while len(got) < count and time.monotonic() < end:
        got.extend(_drain(listener, 0.2))
    return got


def test_notify_once_per_transaction_and_shard_on_commit_only(
    engine: sa.Engine, outboxkit_db_url: str
) -> None:
    channel = notify_channel("outboxkit")
    with psycopg.connect(outboxkit_db_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        with engine.connect() as conn:
            add(conn, Message("t", b"1"))
            add(conn, Message("t", b"2"))
            add_many(conn, [Message("t", b"3"), Message("t", b"4")])
            assert _drain(listener, 0.5) == []  # nothing before commit
            conn.rollback()
            assert _drain(listener, 0.5) == []  # nor after a rollback
            add(conn, Message("t", b"5"))
            add_many(conn, [Message("t", b"6"), Message("t", b"7")])
            conn.commit()
        got = _notifications(listener, 1)
        # Stray notifications (e.g. a schema trigger with another payload) are not ours.
        ours = [n for n in got + _drain(listener, 0.5) if n[0] == channel and n[1] != ""]
        assert ours == [(channel, "0")]


def test_notify_can_be_switched_off(engine: sa.Engine, outboxkit_db_url: str) -> None:
    channel = notify_channel("outboxkit")
    quiet = Outbox(notify=False)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        with engine.begin() as conn:
            quiet.add(conn, Message("t", b"1"))
            quiet.add_many(conn, [Message("t", b"2"), Message("t", b"3")])
        with engine.begin() as conn:
            add(conn, Message("t", b"4"))  # a notifying write, so we know the channel works
        got = _notifications(listener, 1)
        ours = [n for n in got + _drain(listener, 0.5) if n[1] != ""]
        assert ours == [(channel, "0")]


def test_notify_per_shard_in_one_transaction(engine: sa.Engine, outboxkit_db_url: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outboxkit.outbox_setting SET shard_count = 4"))
    channel = notify_channel("outboxkit")
    with psycopg.connect(outboxkit_db_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        with engine.begin() as conn:
            add_many(conn, [Message("t", b"x", key=f"k{i}") for i in range(40)])
            for i in range(40):
                add(conn, Message("t", b"y", key=f"k{i}"))
        got = _notifications(listener, 4)
        ours = sorted(n[1] for n in got + _drain(listener, 0.5) if n[1] != "")
        assert ours == ["0", "1", "2", "3"]


def test_testing_helpers(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        add(session, OrderPlaced(order_id="o-1", total_cents=1))
        add(session, OrderPlaced(order_id="o-2", total_cents=2))
        found = assert_outboxed(session, event_type="order.placed", key="o-1", count=1)
        assert found[0].json() == {"order_id": "o-1", "total_cents": 1}
        assert_outboxed(session, topic="orders", count=2)
        assert_outboxed(session, aggregate_id="o-2")
        assert_not_outboxed(session, key="o-3")
        with pytest.raises(AssertionError, match="expected 3 outboxed"):
            assert_outboxed(session, topic="orders", count=3)
        with pytest.raises(AssertionError, match="found none"):
            assert_outboxed(session, event_type="order.cancelled")


def test_driver_errors_surface_as_sqlalchemy_errors(engine: sa.Engine) -> None:
    event_id = uuid.uuid4()
    with engine.begin() as conn:
        add(conn, Message("t", b"1"), event_id=event_id)
    with engine.connect() as conn, pytest.raises(sa.exc.IntegrityError):
        add(conn, Message("t", b"2"), event_id=event_id, idempotency_key="another")


def test_trace_context_is_stored_with_the_row(engine: sa.Engine) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    ctx = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=False,
        trace_flags=TraceFlags(1),
    )
    with trace.use_span(NonRecordingSpan(ctx)), engine.begin() as conn:
        add(conn, Message("t", b"x", headers={"x-tenant": "acme"}))
        add_many(conn, [Message("t", b"y"), Message("t", b"z", headers={"x-tenant": "b"})])
    first, second, third = rows(engine)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert first["headers"] == {"traceparent": traceparent, "x-tenant": "acme"}
    # add_many reads the trace context once per call: every row carries it, each with its own
    # headers.
    assert second["headers"] == {"traceparent": traceparent}
    assert third["headers"] == {"traceparent": traceparent, "x-tenant": "b"}
    with engine.begin() as conn:  # outside the span: no trace context
        add_many(conn, [Message("t", b"w")])
    assert rows(engine)[-1]["headers"] == {}
