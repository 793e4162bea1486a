"""Our engines replace a pooled connection the server ended while it sat idle, on a real server.

The server ends an idle session by itself with ``idle_session_timeout``, a restart or a
terminated backend; here the backend is terminated. The next checkout must hand out a working
connection: without the check, the first statement after the quiet spell failed
(``terminating connection due to administrator command``), and ``inbox run`` logged its batch
as failed and ran its records again one by one.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
import sqlalchemy as sa

from outboxkit.db.engines import async_engine, ended_while_idle, sync_engine
from tests.support.waiting import wait_for, wait_for_async

pytestmark = pytest.mark.integration

PID = sa.text("SELECT pg_backend_pid()")


def _terminate(db_url: str, pid: int) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_a_connection_ended_while_idle_is_replaced_at_checkout(outboxkit_db_url: str) -> None:
    engine = sync_engine(outboxkit_db_url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            first = conn.execute(PID).scalar_one()
            pooled = conn.connection.driver_connection
        assert not ended_while_idle(pooled)  # idle and alive: nothing to read
        _terminate(outboxkit_db_url, first)
        wait_for(lambda: ended_while_idle(pooled), timeout=10, what="the server's goodbye")
        with engine.connect() as conn:
            assert conn.execute(PID).scalar_one() != first
    finally:
        engine.dispose()


def test_an_async_connection_ended_while_idle_is_replaced_at_checkout(
    outboxkit_db_url: str,
) -> None:
    async def scenario() -> None:
        engine = async_engine(outboxkit_db_url, pool_size=1, max_overflow=0)
        try:
            async with engine.connect() as conn:
                first = (await conn.execute(PID)).scalar_one()
                raw = await conn.get_raw_connection()
                pooled = raw.driver_connection
            assert not ended_while_idle(pooled)
            _terminate(outboxkit_db_url, first)
            await wait_for_async(
                lambda: ended_while_idle(pooled), within=10, what="the server's goodbye"
            )
            async with engine.connect() as conn:
                assert (await conn.execute(PID)).scalar_one() != first
        finally:
            await engine.dispose()

    asyncio.run(scenario())


def test_a_closed_connection_counts_as_ended(outboxkit_db_url: str) -> None:
    conn = psycopg.connect(outboxkit_db_url)
    conn.close()
    assert ended_while_idle(conn)
