"""What rows scheduled for later cost the relay's claim, with and without their moves (0008).

Run: ``python benchmarks/relay_scheduled.py`` (its own durable PostgreSQL unless
``OUTBOXKIT_DATABASE_URL`` names a running one: a scratch database is created and dropped;
``BENCH_SCHEDULED`` rows scheduled for the next day, default 300000; ``BENCH_DUE`` of them made
due at once afterwards, default 100000).

Shard 0 holds 200,000 published rows, 20,000 pending rows due now, and the scheduled rows, all
below the due ones (written first). Printed, in one run: the median of 20 claims of 500 rows
(the relay's ``claim_batch``) while the scheduled rows are still ``pending`` (the relay before
0008, which never moved them), the time the relay's moves take to put them in ``scheduled``,
the median claim then, the time to bring ``BENCH_DUE`` of them back once due, and the median
claim after that. Benchmark code, not part of outboxkit.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import psycopg
from consumer import migrated_database

from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.reader import ShardStore
from outboxkit.relay.scheduling import SCHEDULE_BATCH, Scheduling

SCHEMA = "outboxkit"

SEED = """
INSERT INTO outboxkit.outbox_message
    (event_id, idempotency_key, content_digest, topic, message_key, payload, shard, state,
     deliver_after, published_at)
SELECT gen_random_uuid(), %(kind)s || g, '\\x00', 'bench', 'k' || (g %% 1000), '\\x7b7d', 0,
       %(state)s, %(deliver_after)s, CASE WHEN %(state)s = 'published' THEN now() END
FROM generate_series(1, %(rows)s) g
"""


def _seed(url: str, scheduled: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            SEED, {"kind": "p", "state": "published", "deliver_after": None, "rows": 200_000}
        )
        later = {"kind": "s", "state": "pending", "rows": scheduled}
        conn.execute(SEED, {**later, "deliver_after": "tomorrow"})
        conn.execute(SEED, {"kind": "n", "state": "pending", "deliver_after": None, "rows": 20_000})
        conn.execute("VACUUM ANALYZE outboxkit.outbox_message")


async def _lease(conn: psycopg.AsyncConnection[Any]) -> LeaseTerm:
    row = await (
        await conn.execute(
            "INSERT INTO outboxkit.relay_lease (relay_group, shard, holder, token, expires_at)"
            " VALUES ('bench', 0, 'bench', nextval('outboxkit.relay_fencing_token_seq'),"
            " now() + interval '1 hour') RETURNING token"
        )
    ).fetchone()
    assert row is not None
    return LeaseTerm("bench", 0, "bench", int(row[0]), 3600.0, time.monotonic() + 3000.0)


async def _claim_ms(store: ShardStore, conn: psycopg.AsyncConnection[Any]) -> float:
    times = []
    for _ in range(20):
        started = time.perf_counter()
        found = await store.claim(conn, 0, 500)
        times.append((time.perf_counter() - started) * 1000)
        assert len(found) == 500
    return statistics.median(times)


async def _move_all(
    store: ShardStore, conn: psycopg.AsyncConnection[Any], term: LeaseTerm
) -> tuple[float, int, int]:
    started, later, due = time.perf_counter(), 0, 0
    while True:
        moved = await store.schedule(conn, term, SCHEDULE_BATCH, Scheduling(1.0).ahead)
        later, due = later + moved[0], due + moved[1]
        if max(moved) < SCHEDULE_BATCH:
            return time.perf_counter() - started, later, due


async def _measure(url: str, scheduled: int, made_due: int) -> None:
    store = ShardStore(SCHEMA)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        term = await _lease(conn)
        before = await _claim_ms(store, conn)
        print(
            f"claim of 500, {scheduled:,} rows scheduled for tomorrow still pending:"
            f" {before:.2f} ms (median of 20)"
        )
        seconds, later, _ = await _move_all(store, conn, term)
        print(f"moves: {later:,} rows to 'scheduled' in {seconds:.2f} s, {SCHEDULE_BATCH} a time")
        await conn.execute("VACUUM ANALYZE outboxkit.outbox_message")
        after = await _claim_ms(store, conn)
        print(
            f"claim of 500 with them 'scheduled': {after:.2f} ms (median of 20);"
            f" before / after: {before / after:.1f}x"
        )
        await conn.execute(
            "UPDATE outboxkit.outbox_message SET deliver_after = now() - interval '1 second'"
            " WHERE id IN (SELECT id FROM outboxkit.outbox_message WHERE state = 'scheduled'"
            " ORDER BY id LIMIT %s)",
            (made_due,),
        )
        seconds, _, due = await _move_all(store, conn, term)
        print(f"moves: {due:,} rows due at once back to 'pending' in {seconds:.2f} s")
        await conn.execute("VACUUM ANALYZE outboxkit.outbox_message")
        print(f"claim of 500 after that: {await _claim_ms(store, conn):.2f} ms (median of 20)")


def main() -> None:
    scheduled = int(os.environ.get("BENCH_SCHEDULED", "300000"))
    made_due = int(os.environ.get("BENCH_DUE", "100000"))
    with migrated_database() as url:
        _seed(url, scheduled)
        asyncio.run(_measure(url, scheduled, made_due))


if __name__ == "__main__":
    main()
