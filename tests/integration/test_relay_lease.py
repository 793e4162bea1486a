"""The lease SQL and the token-conditional writes, directly against PostgreSQL.

Expiry is tested by passing the statements a later ``now`` (what production leaves to the
database clock) instead of sleeping through a TTL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from outboxkit import db
from outboxkit.errors import LeaseLostError
from outboxkit.relay.lease import LeaseStore, LeaseTerm
from outboxkit.relay.lease_loss import LeaseLoss
from outboxkit.relay.reader import ShardStore
from tests.relay_support import (
    insert_rows,
    payloads,
    row_states,
    set_shard_count,
)

pytestmark = pytest.mark.integration


_Conn = psycopg.AsyncConnection[Any]


async def _conn(url: str) -> psycopg.AsyncConnection[Any]:
    return await db.connect_async(url)


@dataclass
class _HandedOver:
    """Shard 0 of group "default" taken by holder B (``heir``, term ``new``) after holder A's
    term (``zombie``, ``old``) expired; ``ids`` of pending rows."""

    store: ShardStore
    leases: LeaseStore
    zombie: psycopg.AsyncConnection[Any]
    heir: psycopg.AsyncConnection[Any]
    old: LeaseTerm
    new: LeaseTerm
    ids: list[int]


@asynccontextmanager
async def _handed_over(url: str, rows: int) -> AsyncIterator[_HandedOver]:
    set_shard_count(url, 1)
    ids = insert_rows(url, "t", payloads("k", rows))
    leases = LeaseStore("outboxkit")
    async with await _conn(url) as zombie, await _conn(url) as heir:
        old = await leases.acquire(zombie, "default", 0, "A", 30)
        assert old is not None
        new = await leases.acquire(heir, "default", 0, "B", 30, now=_later(31))
        assert new is not None
        yield _HandedOver(ShardStore("outboxkit"), leases, zombie, heir, old, new, ids)


def _later(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def test_one_holder_tokens_grow_and_only_expiry_or_release_hands_over(
    outboxkit_db_url: str,
) -> None:
    leases = LeaseStore("outboxkit")
    async with await _conn(outboxkit_db_url) as a, await _conn(outboxkit_db_url) as b:
        first = await leases.acquire(a, "g", 0, "A", 30)
        assert first is not None
        assert await leases.acquire(b, "g", 0, "B", 30) is None  # held and not expired
        assert await leases.acquire(b, "g", 0, "B", 30, now=_later(29)) is None  # not yet
        assert await leases.renew(a, first)
        # 31 s later the renewed lease has expired: it is never revived...
        assert not await leases.renew(a, first, now=_later(31))
        assert first.lost_cause is LeaseLoss.CLOCK_JUMP  # trusted here, expired by that clock
        assert first.lost_reason is not None
        assert first.lost_reason.startswith("renewal matched no lease row: expired by the")
        # ...and a standby may take it, with a greater token.
        second = await leases.acquire(b, "g", 0, "B", 30, now=_later(31))
        assert second is not None
        assert second.token > first.token
        assert await leases.release(b, second)
        third = await leases.acquire(a, "g", 0, "A", 30)  # released: taken at once
        assert third is not None
        assert third.token > second.token
        assert not await leases.release(b, second)  # an old token touches nothing
        # Each term knows the token before its own: whether the shard had another holder since
        # a term of its process's (at_least_once owed marks).
        assert (first.previous, second.previous, third.previous) == (
            None,
            first.token,
            second.token,
        )
        assert await leases.release(a, third)
        fourth = await leases.acquire(a, "g", 0, "A", 30)
        assert fourth is not None
        assert fourth.previous == third.token


@asynccontextmanager
async def _held_by_a(
    url: str, leases: LeaseStore
) -> AsyncIterator[tuple[LeaseTerm, _Conn, _Conn, _Conn]]:
    """Shard 0 of group "g" held by A (its term), A's connection and two more."""
    async with (
        await _conn(url) as holder,
        await _conn(url) as second,
        await _conn(url) as third,
    ):
        first = await leases.acquire(holder, "g", 0, "A", 30)
        assert first is not None
        yield first, holder, second, third


async def test_a_standby_attempt_neither_locks_a_held_lease_nor_spends_a_token(
    outboxkit_db_url: str,
) -> None:
    """While the holder's fenced write holds its lease row (FOR SHARE, in an open transaction),
    a standby's attempt under a 200 ms lock_timeout answers "held" at once. Before, ON CONFLICT
    DO UPDATE locked the row before testing its WHERE: the attempt waited for the holder's
    write, and failed under the timeout."""
    leases = LeaseStore("outboxkit")
    async with _held_by_a(outboxkit_db_url, leases) as (first, _, writing, standby):
        await standby.execute("SET lock_timeout = '200ms'")
        async with writing.transaction():
            await writing.execute(
                "SELECT 1 FROM outboxkit.relay_lease WHERE relay_group = 'g' AND shard = 0"
                " FOR SHARE"
            )
            assert await leases.acquire(standby, "g", 0, "B", 30) is None
        assert await leases.acquire(standby, "g", 0, "B", 30) is None
        taken = await leases.acquire(standby, "g", 0, "B", 30, now=_later(31))
        assert taken is not None
        # The attempts that found it held drew no token; the takeover drew one for its insert
        # (not used) and its own under the row's lock.
        assert taken.token == first.token + 2


async def test_a_takeover_draws_its_token_under_the_rows_lock(outboxkit_db_url: str) -> None:
    """A standby finds the lease released and waits for its row while another relay takes the
    lease and gives it up again (one transaction here, so the wait spans both): it then takes
    the lease with a token above that relay's. Before, its token was drawn before the lock,
    so it took the lease with a smaller token than an earlier holder's."""
    leases = LeaseStore("outboxkit")
    async with _held_by_a(outboxkit_db_url, leases) as (first, holder, other, standby):
        assert await leases.release(holder, first)
        async with other.transaction():
            await other.execute(
                "SELECT 1 FROM outboxkit.relay_lease WHERE relay_group = 'g' AND shard = 0"
                " FOR UPDATE"
            )
            attempt = asyncio.ensure_future(leases.acquire(standby, "g", 0, "B", 30))
            await _blocked(holder, standby.info.backend_pid)
            row = await (
                await other.execute(
                    "UPDATE outboxkit.relay_lease SET holder = 'C',"
                    " token = nextval('outboxkit.relay_fencing_token_seq')"
                    " WHERE relay_group = 'g' AND shard = 0 RETURNING token"
                )
            ).fetchone()
            assert row is not None
            await other.execute(
                "UPDATE outboxkit.relay_lease SET holder = NULL"
                " WHERE relay_group = 'g' AND shard = 0"
            )
        taken = await asyncio.wait_for(attempt, 30)
        assert taken is not None
        assert taken.token > row[0]


async def _blocked(probe: psycopg.AsyncConnection[Any], pid: int) -> None:
    """Until backend ``pid`` waits for a lock."""
    async with asyncio.timeout(30):
        while True:
            found = await (
                await probe.execute(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
                )
            ).fetchone()
            if found is not None and found[0] == "Lock":
                return
            await asyncio.sleep(0.02)


async def test_concurrent_acquire_on_a_fresh_database_has_one_winner(
    outboxkit_db_url: str,
) -> None:
    leases = LeaseStore("outboxkit")
    conns: list[psycopg.AsyncConnection[Any]] = []
    try:
        for _ in range(6):  # inside the try: a failed connect still closes the ones before it
            conns.append(await _conn(outboxkit_db_url))
        terms = await asyncio.gather(
            *(leases.acquire(c, "g", 3, f"H{i}", 30) for i, c in enumerate(conns))
        )
    finally:
        for c in conns:
            await c.close()
    assert sum(t is not None for t in terms) == 1


async def test_writes_with_a_stale_token_change_nothing(outboxkit_db_url: str) -> None:
    async with _handed_over(outboxkit_db_url, 3) as h:
        store, zombie, heir, old, new, ids = h.store, h.zombie, h.heir, h.old, h.new, h.ids
        for write in (
            store.mark_published(zombie, old, ids, delete=False),
            store.mark_published(zombie, old, ids, delete=True),
            store.park(zombie, old, ids[0], "x"),
            store.record_failure(zombie, old, ids, "x"),
            store.retention(zombie, old, 0, 10),
        ):
            with pytest.raises(LeaseLostError):
                await write
        assert row_states(outboxkit_db_url) == {"pending": 3}
        assert await store.mark_published(heir, new, ids, delete=False) == 3
        assert row_states(outboxkit_db_url) == {"published": 3}


async def test_retention_deletes_only_rows_older_than_the_window(outboxkit_db_url: str) -> None:
    set_shard_count(outboxkit_db_url, 1)
    ids = insert_rows(outboxkit_db_url, "t", payloads("k", 5))
    leases = LeaseStore("outboxkit")
    store = ShardStore("outboxkit")
    async with await _conn(outboxkit_db_url) as conn:
        hour = 3600.0
        # Held past the later now the retention calls pass: their lease check uses it too.
        term = await leases.acquire(conn, "default", 0, "A", 2 * hour)
        assert term is not None
        assert await store.mark_published(conn, term, ids, delete=False) == 5
        assert await store.retention(conn, term, hour, 10) == 0  # nothing is an hour old
        assert await store.retention(conn, term, hour, 2, now=_later(hour + 1)) == 2  # batches
        assert await store.retention(conn, term, hour, 10, now=_later(hour + 1)) == 3
    assert row_states(outboxkit_db_url) == {}


async def test_a_failed_token_check_says_why(outboxkit_db_url: str) -> None:
    """Taken over, released, or expired by the database clock while still trusted here (what a
    paused database host or a clock step there produces): the error names which."""
    async with _handed_over(outboxkit_db_url, 1) as h:
        store, leases, ids = h.store, h.leases, h.ids
        a, b, old, new = h.zombie, h.heir, h.old, h.new
        with pytest.raises(
            LeaseLostError, match=rf"taken over \(token {new.token} now, held by B\)"
        ):
            await store.mark_published(a, old, ids, delete=False)

        # The database clock runs ahead of this process's: the row expired 5 s ago by it.
        await a.execute(
            "UPDATE outboxkit.relay_lease SET expires_at = now() - interval '5 seconds'"
            " WHERE relay_group = 'default' AND shard = 0"
        )
        assert new.held  # still trusted locally
        with pytest.raises(
            LeaseLostError, match=r"expired by the database clock 5\.\ds ago while this process"
        ) as lost:
            await store.mark_published(b, new, ids, delete=False)
        assert "the clocks disagree" in str(lost.value)
        assert new.lost_reason is not None
        assert "expired by the database clock" in new.lost_reason

        third = await leases.acquire(a, "default", 0, "A", 30)
        assert third is not None
        assert await leases.release(a, third)
        third.lost_reason = None  # as if the release had not been seen by this worker
        with pytest.raises(LeaseLostError, match=r"lost during mark_published: released"):
            await store.mark_published(a, third, ids, delete=False)
    assert row_states(outboxkit_db_url) == {"pending": 1}
