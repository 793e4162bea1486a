"""The next batch's claim overlapped with this batch's handlers: what it would save (experiment).

Run: ``python benchmarks/inbox_claim_overlap.py`` (its own durable PostgreSQL unless
``OUTBOXKIT_DATABASE_URL`` names a running one; ``BENCH_ROUNDS`` default 8, ``BENCH_BATCHES``
per round default 60, ``BENCH_HISTORY`` finished rows of another consumer default 100000).

Per batch of 50 new events, raw psycopg, with the handlers' work (one effect-row INSERT per
event, one round trip each, as the bare consumers of ``benchmarks/consumer.py`` make):

* ``bare``: the effect rows alone, one transaction per batch (what ``bare/batch`` does);
* ``serial``: outboxkit's ``claim_batch``, then one transaction with the effect rows and
  ``mark_succeeded_batch`` (today's order: the claim waits for the previous batch's commit);
* ``overlapped`` (not built): the same statements, but the claim of batch *k+1* runs on a
  second connection (a thread) while batch *k*'s handler transaction runs, and batch *k+1*
  starts once both are done. This is the most a claim pipeline could save on this machine: the
  claim's server work runs beside the handlers' client work on the other core.

Prints wall microseconds per event (each round's total over its events), variants alternating
round by round, medians, and each middleware variant's share of ``bare``. Benchmark code, not
part of outboxkit.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from consumer import HISTORY_SQL, scratch_database
from inbox_claim_shapes import BATCH, CLAIM, MARK, batch_parameters

from outboxkit.db.migrator import upgrade
from outboxkit.devstack import DevStack

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "8"))
BATCHES = int(os.environ.get("BENCH_BATCHES", "60"))
HISTORY = int(os.environ.get("BENCH_HISTORY", "100000"))

EFFECT_TABLE = "CREATE TABLE bench_effect (event_id text PRIMARY KEY, amount integer NOT NULL)"
EFFECT = b"INSERT INTO bench_effect (event_id, amount) VALUES (%s, %s)"

Conn = psycopg.Connection[Any]


def claim(conn: Conn, params: dict[str, Any]) -> None:
    with conn.transaction():
        params["tokens"] = [row[1] for row in conn.execute(CLAIM, params).fetchall()]


def handlers(conn: Conn, params: dict[str, Any], *, mark: bool) -> None:
    with conn.transaction():
        for n, event_id in enumerate(params["event_ids"]):
            conn.execute(EFFECT, (event_id, n))
        if mark and len(conn.execute(MARK, params).fetchall()) != BATCH:
            raise RuntimeError("mark missed rows")


def bare(a: Conn, _: Conn, batches: list[dict[str, Any]], __: ThreadPoolExecutor) -> None:
    for params in batches:
        handlers(a, params, mark=False)


def serial(a: Conn, _: Conn, batches: list[dict[str, Any]], __: ThreadPoolExecutor) -> None:
    for params in batches:
        claim(a, params)
        handlers(a, params, mark=True)


def overlapped(a: Conn, b: Conn, batches: list[dict[str, Any]], pool: ThreadPoolExecutor) -> None:
    claim(b, batches[0])
    for k, params in enumerate(batches):
        following = pool.submit(claim, b, batches[k + 1]) if k + 1 < len(batches) else None
        handlers(a, params, mark=True)
        if following is not None:
            following.result()


Variant = Callable[[Conn, Conn, list[dict[str, Any]], ThreadPoolExecutor], None]
VARIANTS: dict[str, Variant] = {"bare": bare, "serial": serial, "overlapped": overlapped}


def main() -> None:
    with DevStack(durable=True) as stack, scratch_database(stack.database_url) as url:
        upgrade(url)
        with (
            psycopg.connect(url, autocommit=True) as a,
            psycopg.connect(url, autocommit=True) as b,
            ThreadPoolExecutor(1) as pool,
        ):
            a.execute(EFFECT_TABLE)
            a.execute(HISTORY_SQL, {"rows": HISTORY})
            a.execute("VACUUM ANALYZE outboxkit.inbox_message")
            wall: dict[str, list[float]] = {name: [] for name in VARIANTS}
            offset = 0
            for round_ in range(ROUNDS):
                order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
                for name in order:
                    batches = []
                    for _ in range(BATCHES):
                        batches.append(batch_parameters(name, offset))
                        offset += BATCH
                    started = time.perf_counter()
                    VARIANTS[name](a, b, batches, pool)
                    wall[name].append((time.perf_counter() - started) / (BATCHES * BATCH) * 1e6)
        print(f"{ROUNDS} rounds of {BATCHES} batches of {BATCH}, {HISTORY} history rows")
        base = statistics.median(wall["bare"])
        for name in VARIANTS:
            rounds = " / ".join(f"{w:.0f}" for w in wall[name])
            median = statistics.median(wall[name])
            print(
                f"{name:>10}: wall {median:.1f} us/event (rounds {rounds});"
                f" bare's rate / this rate {base / median:.2f}"
            )


if __name__ == "__main__":
    main()
