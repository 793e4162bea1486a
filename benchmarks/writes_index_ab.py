"""The single outbox write with and without one outbox index (an A/B of the schema, not the code).

``python benchmarks/writes_index_ab.py [--rounds N] [--index NAME] [--drop-in a|b]``: one durable
PostgreSQL (self-started), two databases migrated alike, the index dropped in one of them. Each
round runs, in a rotating order and for ``--seconds`` each, the business update alone and with
one outbox row (notify off) on each database (one connection, the writer of this checkout, the
transactions of ``write_worker.py``). The cost of one outbox row is the business-only
throughput over the throughput with the row; medians over the rounds are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import sqlalchemy as sa
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

import write_worker

from outboxkit.db import migrator
from outboxkit.devstack import PostgresServer
from outboxkit.devstack.postgres import database_url_with


def _database(server_url: str, name: str, drop: str | None) -> str:
    database = f"ix_{name}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    url = database_url_with(server_url, database)
    migrator.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE account (id integer PRIMARY KEY, balance bigint NOT NULL)")
        conn.execute("INSERT INTO account SELECT g, 0 FROM generate_series(1, 10000) g")
        if drop is not None:
            conn.execute(sql.SQL("DROP INDEX outboxkit.{}").format(sql.Identifier(drop)))
    return url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--index", default="outbox_message_discarded_idx")
    parser.add_argument("--drop-in", choices=["a", "b"], default="b")
    args = parser.parse_args()
    pg = PostgresServer(durable=True)
    pg.start()
    try:
        runs: dict[tuple[str, str], Callable[[int], None]] = {}
        for name in ("a", "b"):
            url = _database(pg.url, name, args.index if name == args.drop_in else None)
            engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
            for variant in ("base", "notify_off"):
                run = write_worker.transaction(engine, variant)
                for i in range(300):  # warm-up: connection, prepared statements
                    run(1 + i)
                runs[(name, variant)] = run
        keep = "a" if args.drop_in == "b" else "b"
        costs: dict[str, list[float]] = {"a": [], "b": []}
        keys = list(runs)
        for r in range(args.rounds):
            rate = {}
            for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
                run, done, end = runs[key], 0, time.perf_counter() + args.seconds
                while time.perf_counter() < end:
                    run(1 + (done * 7919) % 10000)
                    done += 1
                rate[key] = done / args.seconds
            for name in costs:
                costs[name].append(rate[(name, "base")] / rate[(name, "notify_off")])
            print(
                f"round {r + 1}: with {args.index} {costs[keep][-1]:.2f}x,"
                f" without {costs[args.drop_in][-1]:.2f}x",
                flush=True,
            )
        print(
            f"cost of one outbox row, median of {args.rounds} rounds: with {args.index}"
            f" {statistics.median(costs[keep]):.2f}x, without"
            f" {statistics.median(costs[args.drop_in]):.2f}x (dropped in database {args.drop_in})"
        )
    finally:
        pg.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
