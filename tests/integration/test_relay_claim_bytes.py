"""The claim: stops at ``max_batch_bytes`` of payload (running sum in SQL), never below one row;
leaves out rows in flight by id, never by an id bound (per-key order)."""

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
    ids = insert_rows(outboxkit_db_url, "t", [("k", b"x" * n) for n in sizes])
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
