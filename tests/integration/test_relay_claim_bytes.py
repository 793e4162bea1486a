"""The claim: stops at ``max_batch_bytes`` of payload (running sum in SQL), never below one row;
leaves out rows in flight by id, never by an id bound (per-key order); claims nothing for a
shard beyond the count."""

from __future__ import annotations

import psycopg
import pytest

from outboxkit import db
from outboxkit.relay.reader import ShardStore
from tests.relay_support import (
    insert_rows,
    set_shard_count,
)

pytestmark = pytest.mark.integration


async def test_claim_stops_at_the_byte_cap_and_always_takes_the_first_row(
    outboxkit_db_url: str,
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    sizes = [3000, 1000, 1000, 1000, 5000, 10]
    ids = insert_rows(outboxkit_db_url, "t", [(None, b"x" * n) for n in sizes])  # no key bytes
    async with await db.connect_async(outboxkit_db_url) as conn:

        async def claim(max_bytes: int, in_flight: list[int] | None = None) -> list[int]:
            store = ShardStore("outboxkit", max_bytes=max_bytes)
            rows = await store.claim(conn, 0, 100, in_flight or [])
            return [r.id for r in rows]

        assert await claim(5000) == ids[:3]  # 3000 + 1000 + 1000 = 5000 fits; the next does not
        assert await claim(4999) == ids[:2]
        assert await claim(1024) == ids[:1]  # larger than the cap: still one row, never stuck
        assert await claim(1024, ids[:4]) == ids[4:5]
        assert await claim(10**9) == ids  # the row limit still applies on its own
        assert len(await ShardStore("outboxkit").claim(conn, 0, 2)) == 2


async def test_a_row_that_committed_late_comes_before_newer_rows_of_its_key(
    outboxkit_db_url: str,
) -> None:
    """Inside one Kafka transaction the next claim leaves out the rows already claimed, never
    with an ``id >`` bound: a writer's row that committed late, below them, must go out before
    a newer row of its key (the writer of which waited for it), or per-key order breaks."""
    set_shard_count(outboxkit_db_url, 1)
    slow = psycopg.connect(outboxkit_db_url)  # holds the key's first row open (lowest id)
    try:
        (late,) = insert_rows(slow, "t", [("K", b"k1")])
        others = insert_rows(outboxkit_db_url, "t", [(f"o{n}", b"x") for n in range(5)])
        store = ShardStore("outboxkit")
        async with await db.connect_async(outboxkit_db_url) as conn:
            first = [r.id for r in await store.claim(conn, 0, 5)]
            assert first == others  # the open transaction's row is invisible
            slow.commit()
            (newer,) = insert_rows(outboxkit_db_url, "t", [("K", b"k2")])
            following = await store.claim(conn, 0, 5, first)
        assert [r.id for r in following] == [late, newer]
        assert late < min(others) < newer
    finally:
        slow.close()


async def test_a_shard_beyond_the_count_claims_nothing(outboxkit_db_url: str) -> None:
    """A worker still running for a shard the count no longer has (the count was lowered while
    it ran) must claim nothing: its rows are shard 0's to park as strays, and a row two
    holders claim could be sent twice."""
    set_shard_count(outboxkit_db_url, 2)
    ids = insert_rows(outboxkit_db_url, "t", [(None, b"x") for _ in range(3)])
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute("UPDATE outboxkit.outbox_message SET shard = 1 WHERE id = ANY(%s)", (ids,))
    store = ShardStore("outboxkit")
    async with await db.connect_async(outboxkit_db_url) as conn:
        assert [r.id for r in await store.claim(conn, 1, 10)] == ids  # within the count
        set_shard_count(outboxkit_db_url, 1)
        assert await store.claim(conn, 1, 10) == []


async def test_headers_and_keys_count_towards_the_byte_cap(outboxkit_db_url: str) -> None:
    """The writer lets headers grow as large as a payload: a claim of rows with large headers
    and tiny payloads must stop at the cap too, or one claim could hold gigabytes."""
    set_shard_count(outboxkit_db_url, 1)
    ids = insert_rows(
        outboxkit_db_url, "t", [("k" * 500, b"x") for _ in range(4)], headers={"h": "v" * 2000}
    )
    store = ShardStore("outboxkit", max_bytes=5000)
    async with await db.connect_async(outboxkit_db_url) as conn:
        rows = await store.claim(conn, 0, 100)
    assert [r.id for r in rows] == ids[:1]  # ~2,500 bytes a row: the second passes 5,000
    # What the claim size adapts to (a claim cut by bytes means a backlog): the same count.
    assert store.claimed_bytes == 1 + 500 + len('{"h": "' + "v" * 2000 + '"}')
