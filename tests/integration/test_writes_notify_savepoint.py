"""The writer's NOTIFY after a caller's savepoint rolled back: the notification it sent there is
gone with the savepoint, so the next write on that shard sends it again (sync and async)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from outboxkit.events import Message
from outboxkit.outbox import Outbox
from outboxkit.schema import notify_channel
from tests.integration.test_writes_sync import _drain, _notifications

pytestmark = pytest.mark.integration

_OUTBOX = Outbox()
CHANNEL = notify_channel("outboxkit")


@pytest.fixture
def listener(outboxkit_db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(f'LISTEN "{CHANNEL}"')
        yield conn


def _ours(listener: psycopg.Connection) -> list[tuple[str, str]]:
    """The writer's notifications once the transaction committed (one is awaited first)."""
    got = _notifications(listener, 1) + _drain(listener, 0.5)
    return [n for n in got if n[0] == CHANNEL and n[1] != ""]


def test_a_rolled_back_savepoint_takes_its_notification_and_the_next_write_sends_it_again(
    engine: sa.Engine, listener: psycopg.Connection
) -> None:
    with engine.begin() as conn:
        savepoint = conn.begin_nested()
        _OUTBOX.add(conn, Message("t", b"1"))  # notifies shard 0, inside the savepoint
        savepoint.rollback()
        _OUTBOX.add(conn, Message("t", b"2"))  # must notify again: the first one is gone
    assert _ours(listener) == [(CHANNEL, "0")]


def test_a_session_savepoint_rolled_back_too(
    engine: sa.Engine, listener: psycopg.Connection
) -> None:
    with Session(engine) as session, session.begin():
        with session.begin_nested() as nested:
            _OUTBOX.add_many(session, [Message("t", b"1"), Message("t", b"2")])
            nested.rollback()
        _OUTBOX.add(session, Message("t", b"3"))
    assert _ours(listener) == [(CHANNEL, "0")]


def test_a_released_savepoint_keeps_its_notification(
    engine: sa.Engine, listener: psycopg.Connection
) -> None:
    """Released, the savepoint's notification stands (a listener cannot tell whether the writer
    repeats it: PostgreSQL delivers identical ones of a transaction once), and it is not lost
    to a later savepoint rolled back."""
    with engine.begin() as conn:
        with conn.begin_nested():
            _OUTBOX.add(conn, Message("t", b"1"))
        _OUTBOX.add(conn, Message("t", b"2"))
        inner = conn.begin_nested()
        _OUTBOX.add(conn, Message("t", b"3"))  # the outer transaction's one still stands
        inner.rollback()
    assert _ours(listener) == [(CHANNEL, "0")]


def test_an_outer_notification_survives_an_inner_rollback(
    engine: sa.Engine, listener: psycopg.Connection
) -> None:
    """Sent before the savepoint, it is not taken back by it: the rows written after the
    rollback still wake the relay."""
    with engine.begin() as conn:
        _OUTBOX.add(conn, Message("t", b"1"))
        inner = conn.begin_nested()
        _OUTBOX.add(conn, Message("t", b"2"))
        inner.rollback()
        _OUTBOX.add(conn, Message("t", b"3"))
    assert _ours(listener) == [(CHANNEL, "0")]
    with engine.connect() as conn:
        payloads = conn.execute(
            sa.text("SELECT payload FROM outboxkit.outbox_message ORDER BY id")
        ).scalars()
        assert [bytes(p) for p in payloads] == [b"1", b"3"]


def test_an_outer_savepoint_rolled_back_with_an_inner_one_still_open(
    engine: sa.Engine, listener: psycopg.Connection
) -> None:
    """SQLAlchemy warns and leaves the inner savepoint marked open, but the database rolled its
    notification back with the outer one."""
    with engine.begin() as conn:
        outer = conn.begin_nested()
        conn.begin_nested()
        _OUTBOX.add(conn, Message("t", b"1"))
        with pytest.warns(sa.exc.SAWarning):
            outer.rollback()
        _OUTBOX.add(conn, Message("t", b"2"))
    assert _ours(listener) == [(CHANNEL, "0")]


def test_the_copy_path_in_a_savepoint_rolled_back(
    engine: sa.Engine, listener: psycopg.Connection
) -> None:
    with engine.begin() as conn:
        savepoint = conn.begin_nested()
        _OUTBOX.add_many(conn, [Message("t", b"%d" % i) for i in range(200)])  # a COPY
        savepoint.rollback()
        _OUTBOX.add(conn, Message("t", b"last"))
    assert _ours(listener) == [(CHANNEL, "0")]


async def test_async_a_rolled_back_savepoint_takes_its_notification(
    aengine: AsyncEngine, listener: psycopg.Connection
) -> None:
    async with aengine.begin() as conn:
        savepoint = await conn.begin_nested()
        await _OUTBOX.add_async(conn, Message("t", b"1"))
        await savepoint.rollback()
        await _OUTBOX.add_async(conn, Message("t", b"2"))
    assert _ours(listener) == [(CHANNEL, "0")]


async def test_async_session_savepoint_rolled_back(
    aengine: AsyncEngine, listener: psycopg.Connection
) -> None:
    async with AsyncSession(aengine) as session, session.begin():
        nested = await session.begin_nested()
        await _OUTBOX.add_async(session, Message("t", b"1"))
        await nested.rollback()
        await _OUTBOX.add_async(session, Message("t", b"2"))
    assert _ours(listener) == [(CHANNEL, "0")]
