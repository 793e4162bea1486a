"""What rows behind a parked row of their key cost the relay's claim, with and without their
moves to 'held' (0009).

Run: ``python benchmarks/relay_held.py`` (its own durable PostgreSQL unless
``OUTBOXKIT_DATABASE_URL`` names a running one: a scratch database is created and dropped;
``BENCH_BEHIND`` rows behind the parked key, default 100000).

Shard 0 holds 200,000 published rows, one parked row of key "hot", the rows of "hot" written
after it, then 20,000 pending rows of other keys. Printed, in one run: the median of 20 claims of
500 rows (the relay's ``claim_batch``) while the rows behind the parked key are still
``pending`` (the relay before 0009, which never moved them), the time the relay's passes take to
move them to ``held``, the median claim then, and the time ``outbox retry`` of the parked row
takes to bring them back. Benchmark code, not part of outboxkit.
"""

from __future__ import annotations

import asyncio
import os
import time

import psycopg
from click.testing import CliRunner
from consumer import migrated_database
from relay_scheduled import _claim_ms, _lease

from outboxkit.cli import main as cli_main
from outboxkit.relay.reader import ShardStore
from outboxkit.relay.scheduling import SCHEDULE_BATCH, Scheduling

SCHEMA = "outboxkit"

SEED = """
INSERT INTO outboxkit.outbox_message
    (event_id, idempotency_key, content_digest, topic, message_key, payload, shard, state,
     published_at)
SELECT gen_random_uuid(), %(kind)s || g, '\\x00', 'bench', %(key)s || (g %% %(keys)s), '\\x7b7d',
       0, 'pending', NULL
FROM generate_series(1, %(rows)s) g
"""


def _seed(url: str, behind: int) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED, {"kind": "p", "key": "k", "keys": 1000, "rows": 200_000})
        conn.execute(
            "UPDATE outboxkit.outbox_message SET state = 'published', published_at = now()"
        )
        conn.execute(SEED, {"kind": "x", "key": "hot", "keys": 1, "rows": 1})
        row = conn.execute(
            "UPDATE outboxkit.outbox_message SET state = 'parked', parked_reason = 'bench',"
            " parked_at = now() WHERE idempotency_key = 'x1' RETURNING id"
        ).fetchone()
        assert row is not None
        conn.execute(SEED, {"kind": "b", "key": "hot", "keys": 1, "rows": behind})
        conn.execute(SEED, {"kind": "n", "key": "k", "keys": 1000, "rows": 20_000})
        conn.execute("VACUUM ANALYZE outboxkit.outbox_message")
        return int(row[0])


async def _measure(url: str, behind: int, parked: int) -> None:
    store = ShardStore(SCHEMA)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        term = await _lease(conn)
        before = await _claim_ms(store, conn)
        print(f"claim of 500, {behind:,} rows behind a parked key still pending: {before:.2f} ms")
        started, held = time.perf_counter(), 0
        while True:
            moves = await store.schedule(conn, term, SCHEDULE_BATCH, Scheduling(1.0).ahead)
            held += moves.held
            if moves.held < SCHEDULE_BATCH:
                break
        seconds = time.perf_counter() - started
        print(f"passes: {held:,} rows to 'held' in {seconds:.2f} s, {SCHEDULE_BATCH} a time")
        await conn.execute("VACUUM ANALYZE outboxkit.outbox_message")
        after = await _claim_ms(store, conn)
        print(
            f"claim of 500 with them 'held': {after:.2f} ms (medians of 20);"
            f" before / after: {before / after:.1f}x"
        )
    started = time.perf_counter()
    result = CliRunner().invoke(
        cli_main, ["outbox", "retry", str(parked)], env={"OUTBOXKIT_DATABASE_URL": url}
    )
    assert result.exit_code == 0, result.output
    print(
        f"outbox retry of the parked row, its {behind:,} held rows back: "
        f"{time.perf_counter() - started:.2f} s"
    )


def main() -> None:
    behind = int(os.environ.get("BENCH_BEHIND", "100000"))
    with migrated_database() as url:
        parked = _seed(url, behind)
        asyncio.run(_measure(url, behind, parked))


if __name__ == "__main__":
    main()
