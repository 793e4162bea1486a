"""The lease SQL and the token-conditional writes, directly against PostgreSQL."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from outboxkit.errors import LeaseLostError
from outboxkit.relay.lease import LeaseStore
from outboxkit.relay.reader import ShardStore
from tests.relay_support import insert_rows, payloads, row_states, set_shard_count

pytestmark = pytest.mark.integration


async def _conn(url: str) -> psycopg.AsyncConnection:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


def _expire(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE outboxkit.relay_lease SET expires_at = now() - interval '1 second'")


async def test_one_holder_tokens_grow_and_only_expiry_or_release_hands_over(
    outboxkit_db_url: str,
) -> None:
    leases = LeaseStore("outboxkit")
    async with await _conn(outboxkit_db_url) as a, await _conn(outboxkit_db_url) as b:
        first = await leases.acquire(a, "g", 0, "A", 30)
        assert first is not None
        assert await leases.acquire(b, "g", 0, "B", 30) is None  # held and not expired
        assert await leases.renew(a, first)
        _expire(outboxkit_db_url)
        assert not await leases.renew(a, first)  # an expired lease is never revived
        assert first.lost_reason is not None
        second = await leases.acquire(b, "g", 0, "B", 30)
        assert second is not None
        assert second.token > first.token
        assert await leases.release(b, second)
        third = await leases.acquire(a, "g", 0, "A", 30)  # released: taken at once
        assert third is not None
        assert third.token > second.token
        assert not await leases.release(b, second)  # an old token touches nothing


async def test_concurrent_acquire_on_a_fresh_database_has_one_winner(
    outboxkit_db_url: str,
) -> None:
    leases = LeaseStore("outboxkit")
    conns = [await _conn(outboxkit_db_url) for _ in range(6)]
    try:
        terms = await asyncio.gather(
            *(leases.acquire(c, "g", 3, f"H{i}", 30) for i, c in enumerate(conns))
        )
    finally:
        for c in conns:
            await c.close()
    assert sum(t is not None for t in terms) == 1


async def test_writes_with_a_stale_token_change_nothing(outboxkit_db_url: str) -> None:
    set_shard_count(outboxkit_db_url, 1)
    ids = insert_rows(outboxkit_db_url, "t", payloads("k", 3))
    leases = LeaseStore("outboxkit")
    store = ShardStore("outboxkit")
    async with await _conn(outboxkit_db_url) as zombie, await _conn(outboxkit_db_url) as heir:
        old = await leases.acquire(zombie, "default", 0, "A", 30)
        assert old is not None
        _expire(outboxkit_db_url)
        new = await leases.acquire(heir, "default", 0, "B", 30)
        assert new is not None
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
