"""A stop (a task's cancellation, a ``KeyboardInterrupt``) that comes while psycopg starts
``add_many``'s COPY: the caller gets the stop, unchanged, and the connection is not left in
the COPY.

The fault point is the moment after the server entered the COPY and before psycopg made the
object that ends it (``Copy.__enter__``): there a cancellation that psycopg's own cancel
request cannot undo (the server waits for COPY data, which a cancel request does not end)
leaves the server in the COPY. Before, every later statement on the connection failed with
"another command is already in progress", and that error replaced the stop: the caller's
rollback raised it instead of the ``CancelledError`` (a timeout became an ``OperationalError``)
and the pool logged a failed reset.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from outboxkit import db
from outboxkit.db.queries import Query
from outboxkit.events import Message
from outboxkit.outbox import Outbox

pytestmark = pytest.mark.integration

COPYING = Outbox(copy_min_rows=10)
ITEMS = [Message("t", {"n": i}) for i in range(30)]


def _count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        query = sa.text("SELECT count(*) FROM outboxkit.outbox_message")
        return int(conn.execute(query).scalar_one())


@pytest.fixture
def stop_at_copy_start(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first COPY of the test is stopped as it starts (each kind with its stop)."""
    stops: list[int] = []

    def enter(self: Any) -> Any:
        if not stops:
            stops.append(1)
            raise KeyboardInterrupt
        return real_enter(self)

    async def aenter(self: Any) -> Any:
        if not stops:
            stops.append(1)
            raise asyncio.CancelledError
        return await real_aenter(self)

    real_enter, real_aenter = psycopg.Copy.__enter__, psycopg.AsyncCopy.__aenter__
    monkeypatch.setattr(psycopg.Copy, "__enter__", enter)
    monkeypatch.setattr(psycopg.AsyncCopy, "__aenter__", aenter)
    return stops


def _no_failed_reset(caplog: pytest.LogCaptureFixture) -> None:
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


async def test_a_cancellation_as_the_copy_starts_stays_a_cancellation(
    aengine: AsyncEngine,
    engine: sa.Engine,
    stop_at_copy_start: list[int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR)
    async with AsyncSession(aengine) as session:
        with pytest.raises(asyncio.CancelledError):
            async with session.begin():
                await COPYING.add_many_async(session, ITEMS)
    assert stop_at_copy_start == [1]
    async with AsyncSession(aengine) as session, session.begin():
        await COPYING.add_many_async(session, ITEMS)  # the pool's next connection works
    assert _count(engine) == len(ITEMS)  # the stopped call's rows: none
    _no_failed_reset(caplog)


def test_a_keyboard_interrupt_as_the_copy_starts_stays_one(
    engine: sa.Engine, stop_at_copy_start: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    with Session(engine) as session, pytest.raises(KeyboardInterrupt), session.begin():
        COPYING.add_many(session, ITEMS)
    assert stop_at_copy_start == [1]
    with Session(engine) as session, session.begin():
        COPYING.add_many(session, ITEMS)
    assert _count(engine) == len(ITEMS)
    _no_failed_reset(caplog)


async def test_a_psycopg_connection_left_in_the_copy_is_closed(
    outboxkit_db_url: str, stop_at_copy_start: list[int]
) -> None:
    """The seam's COPY on a caller's own psycopg connection, which cannot be invalidated: it
    is closed, so its next use says so instead of "another command is already in progress"."""
    copy = Query("test", "copy", "COPY copied (n) FROM STDIN")
    conn = await psycopg.AsyncConnection.connect(outboxkit_db_url)
    try:
        await conn.execute("CREATE TEMPORARY TABLE copied (n integer)")
        with pytest.raises(asyncio.CancelledError):
            await db.copy_rows_async(conn, copy, [(n,) for n in range(30)])
        assert conn.closed
    finally:
        await conn.close()


def test_a_sync_psycopg_connection_left_in_the_copy_is_closed(
    outboxkit_db_url: str, stop_at_copy_start: list[int]
) -> None:
    copy = Query("test", "copy", "COPY copied (n) FROM STDIN")
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute("CREATE TEMPORARY TABLE copied (n integer)")
        with pytest.raises(KeyboardInterrupt):
            db.copy_rows(conn, copy, [(n,) for n in range(30)])
        assert conn.closed


def test_a_copy_refused_in_pipeline_mode_leaves_the_connection_open(
    outboxkit_db_url: str,
) -> None:
    """Commands queued in a pipeline are under way too (libpq says ACTIVE): psycopg refuses the
    COPY there, and the caller's connection is fine, so it stays open."""
    copy = Query("test", "copy", "COPY copied (n) FROM STDIN")
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute("CREATE TEMPORARY TABLE copied (n integer)")
        with conn.pipeline():
            conn.execute("SELECT 1")
            with pytest.raises(psycopg.NotSupportedError):
                db.copy_rows(conn, copy, [(1,)])
        assert not conn.closed
        assert conn.execute("SELECT 1").fetchone() == (1,)
