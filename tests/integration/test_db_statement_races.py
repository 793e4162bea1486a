"""On a database whose default isolation level is stricter than READ COMMITTED (what a shop that
wants it for its application sets), a statement of ours on its own still runs at READ COMMITTED,
so it neither fails with serialization failures (before, the relay ended its term on one: a new
producer, reconciliation, seconds without publishing) nor takes part in the conflict checks of
the application's serializable transactions; a caller's transaction keeps its own level. The
race here: a row another transaction changed while the statement waited for it, which at
REPEATABLE READ or SERIALIZABLE fails the statement."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest
from psycopg import sql

from outboxkit import db
from outboxkit.relay.lease import LeaseStore, LeaseTerm
from tests.relay_support import set_shard_count
from tests.support.db_names import database_of

pytestmark = pytest.mark.integration

CHANGE_THE_LEASE_ROW = "UPDATE outboxkit.relay_lease SET renewed_at = renewed_at"


@pytest.fixture(params=["repeatable read", "serializable"])
def strict_db_url(outboxkit_db_url: str, request: pytest.FixtureRequest) -> str:
    database = database_of(outboxkit_db_url)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
                sql.Identifier(database), sql.Literal(request.param)
            )
        )
    set_shard_count(outboxkit_db_url, 1)
    return outboxkit_db_url


async def test_a_statement_of_ours_on_its_own_runs_at_read_committed(strict_db_url: str) -> None:
    level = db.Query("t", "level", "SELECT current_setting('transaction_isolation')")
    async with await db.connect_async(strict_db_url) as conn:
        assert await db.rows_async(conn, level) == [("read committed",)]
        async with conn.transaction():  # an explicit transaction of ours: BEGIN says the level
            assert await db.rows_async(conn, level) == [("read committed",)]
    with db.connect(strict_db_url) as sync_conn:
        assert db.rows(sync_conn, level) == [("read committed",)]
    async with await psycopg.AsyncConnection.connect(strict_db_url) as theirs:
        assert (await db.rows_async(theirs, level))[0][0] != "read committed"


async def _until_waiting_for_a_lock(url: str, pid: int) -> None:
    """Returns once backend ``pid`` waits for a row lock (read from pg_stat_activity)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watcher:
        async with asyncio.timeout(10):
            while True:
                cur = await watcher.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
                )
                if await cur.fetchone() == ("Lock",):
                    return


async def _held(
    conn: psycopg.AsyncConnection[Any], leases: LeaseStore, shard: int = 0
) -> LeaseTerm:
    term = await leases.acquire(conn, "default", shard, "A", 30)
    assert term is not None
    return term


async def test_a_renewal_waiting_for_a_row_another_transaction_changes_succeeds(
    strict_db_url: str,
) -> None:
    leases = LeaseStore("outboxkit")
    async with await db.connect_async(strict_db_url) as conn:
        term = await _held(conn, leases)
        with psycopg.connect(strict_db_url) as other:
            other.execute(CHANGE_THE_LEASE_ROW)  # holds the row until it commits
            renewal = asyncio.create_task(leases.renew(conn, term))
            await _until_waiting_for_a_lock(strict_db_url, conn.info.backend_pid)
            other.commit()  # the renewal's snapshot is older than the row now
        assert await asyncio.wait_for(renewal, 10)
        assert term.lost_reason is None


async def test_a_statement_inside_a_transaction_is_not_run_again(strict_db_url: str) -> None:
    """A caller's transaction, at the database's default level (REPEATABLE READ here)."""
    leases = LeaseStore("outboxkit")
    async with await psycopg.AsyncConnection.connect(strict_db_url) as conn:
        term = await _held(conn, leases)
        await conn.commit()
        await conn.execute("SELECT 1")  # the transaction's snapshot, from now on
        with psycopg.connect(strict_db_url) as other:
            other.execute(CHANGE_THE_LEASE_ROW)
            other.commit()
        with pytest.raises(psycopg.errors.SerializationFailure):
            await leases.renew(conn, term)


async def test_another_tasks_statement_waits_for_a_statements_own_transaction(
    strict_db_url: str,
) -> None:
    """The relay's tasks share connections (a park while the previous batch's mark runs): a
    statement sent while another's own transaction is open must not run inside it."""
    xid = db.Query("t", "xid", "SELECT CAST(pg_current_xact_id_if_assigned() AS text)")
    leases = LeaseStore("outboxkit")
    async with await db.connect_async(strict_db_url) as conn:
        term = await _held(conn, leases)
        with psycopg.connect(strict_db_url) as other:
            other.execute(CHANGE_THE_LEASE_ROW)
            renewal = asyncio.create_task(leases.renew(conn, term))
            await _until_waiting_for_a_lock(strict_db_url, conn.info.backend_pid)
            second = asyncio.create_task(db.rows_async(conn, xid))
            await asyncio.sleep(0)  # not a wait for time: the task runs until it must wait
            assert not second.done()
            other.commit()
        assert await asyncio.wait_for(renewal, 10)
        assert await asyncio.wait_for(second, 10) == [(None,)]  # a transaction of its own


async def test_a_statement_on_its_own_a_deadlock_ended_runs_again(
    strict_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The renewal of two shards holds one lease row and waits for the other, which a second
    transaction holds and then asks for the first: a deadlock. The renewal's backend finds it
    first (the other waits a minute before looking) and ends its statement (40P01)."""
    caplog.set_level(logging.DEBUG, logger="outboxkit.db")
    set_shard_count(strict_db_url, 2)
    leases = LeaseStore("outboxkit")
    async with await db.connect_async(strict_db_url) as conn:
        terms = [await _held(conn, leases, shard) for shard in (0, 1)]
        with psycopg.connect(strict_db_url) as other:
            other.execute("SET deadlock_timeout = '60s'")
            other.execute(f"{CHANGE_THE_LEASE_ROW} WHERE shard = 1")
            renewal = asyncio.create_task(leases.renew_many(conn, terms))
            await _until_waiting_for_a_lock(strict_db_url, conn.info.backend_pid)
            other.execute(f"{CHANGE_THE_LEASE_ROW} WHERE shard = 0")  # once the renewal ended
            other.commit()
        assert await asyncio.wait_for(renewal, 10) == []  # none lost
        assert all(term.lost_reason is None for term in terms)
    assert "a statement lost a race (40P01); running it again" in caplog.text
