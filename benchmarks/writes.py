"""What the outbox costs an application transaction, and how fast bulk writes go.

Run: ``python benchmarks/writes.py`` (starts its own durable PostgreSQL unless
``OUTBOXKIT_DATABASE_URL`` names a server; then a scratch database is created on it and dropped).

(a) Throughput of an application transaction that updates one business row, without and with one
    outbox row, at 1 and 8 connections (separate processes, so Python's GIL is not the limit),
    with the writer's NOTIFY off and on. Variants run interleaved, best of the rounds is kept.
(b) ``add_many`` rows/s against a raw psycopg ``COPY`` of the same rows into the outbox table.
Nothing here asserts on speed; it prints numbers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import sql

from outboxkit.db import migrator
from outboxkit.devstack import PostgresServer
from outboxkit.devstack.postgres import database_url_with, sqlalchemy_url
from outboxkit.events import Message
from outboxkit.outbox import Outbox, OutboxConfig
from outboxkit.outbox_plan import prepare

ACCOUNTS = 10_000
TRIGGER = "outbox_message_notify"  # a relay-side NOTIFY trigger, if the schema has one


@dataclass(frozen=True)
class Variant:
    name: str
    outbox: bool
    notify: bool = False
    trigger: bool = False
    plain_insert: bool = False


VARIANTS = [
    Variant("business update only", outbox=False),
    Variant("+ plain hand-written INSERT (reference)", outbox=False, plain_insert=True),
    Variant("+ outbox row, notify off", outbox=True),
    Variant("+ outbox row, notify on", outbox=True, notify=True),
]


def _worker(
    url: str,
    variant: Variant,
    worker: int,
    workers: int,
    ready: Any,
    start: Any,
    seconds: float,
    out: Any,
) -> None:
    engine = sa.create_engine(url, pool_size=1, max_overflow=0)
    outbox = Outbox(notify=variant.notify)
    update = sa.text("UPDATE account SET balance = balance + 1 WHERE id = :id")
    plain = sa.text(
        "INSERT INTO outboxkit.outbox_message (event_id, idempotency_key, content_digest, topic,"
        " message_key, payload, content_type, event_type)"
        " VALUES (:e, :k, '', 'account-events', :key, :p, 'application/json', 'balance.changed')"
    )
    rng = random.Random(worker)
    own = [i for i in range(1, ACCOUNTS + 1) if i % workers == worker]  # no lock waits

    def one() -> None:
        account = rng.choice(own)
        with engine.begin() as conn:
            conn.execute(update, {"id": account})
            if variant.plain_insert:
                event_id = uuid.uuid4()
                payload = json.dumps({"account": account, "delta": 1, "note": "balance changed"})
                conn.execute(
                    plain,
                    {"e": event_id, "k": str(event_id), "key": str(account), "p": payload.encode()},
                )
            if variant.outbox:
                outbox.add(
                    conn,
                    Message(
                        "account-events",
                        {"account": account, "delta": 1, "note": "balance changed"},
                        key=str(account),
                        event_type="balance.changed",
                    ),
                )

    for _ in range(50):
        one()
    ready.put(worker)
    start.wait()
    done = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        one()
        done += 1
    out.put(done)
    engine.dispose()


def measure_tps(url: str, variant: Variant, workers: int, seconds: float) -> float:
    ctx = mp.get_context("fork")
    ready, out, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_worker, args=(url, variant, w, workers, ready, start, seconds, out))
        for w in range(workers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    started = time.monotonic()
    start.set()
    total = sum(out.get(timeout=seconds + 120) for _ in procs)
    elapsed = time.monotonic() - started
    for p in procs:
        p.join(timeout=60)
    return total / max(elapsed, seconds)


def set_trigger(dsn: str, enabled: bool) -> bool:
    """Switch the schema's NOTIFY trigger, if there is one; returns whether it exists."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT 1 FROM pg_trigger WHERE tgname = %s AND NOT tgisinternal", (TRIGGER,)
        ).fetchone()
        if row:
            action = "ENABLE" if enabled else "DISABLE"
            conn.execute(
                sql.SQL("ALTER TABLE outboxkit.outbox_message {} TRIGGER {}").format(
                    sql.SQL(action), sql.Identifier(TRIGGER)
                )
            )
        return row is not None


def reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE outboxkit.outbox_message")
        conn.execute("VACUUM ANALYZE outboxkit.outbox_message")
        conn.execute("VACUUM ANALYZE account")
        conn.execute("CHECKPOINT")


def part_a(dsn: str, url: str, seconds: float, rounds: int) -> dict[tuple[str, int], float]:
    variants = list(VARIANTS)
    if set_trigger(dsn, enabled=False):
        variants.append(
            Variant(f"+ outbox row, notify off, {TRIGGER} trigger on", True, False, True)
        )
    best: dict[tuple[str, int], float] = {}
    per_round: dict[tuple[str, int], list[float]] = {}
    for round_ in range(rounds):
        for workers in (1, 8):
            for variant in variants:
                reset(dsn)
                set_trigger(dsn, enabled=variant.trigger)
                tps = measure_tps(url, variant, workers, seconds)
                key = (variant.name, workers)
                best[key] = max(best.get(key, 0.0), tps)
                per_round.setdefault(key, []).append(tps)
                print(f"  round {round_ + 1} {workers} conn  {variant.name:<48} {tps:8.0f} tx/s")
    set_trigger(dsn, enabled=True)
    print("\n(a) application transaction. cost = best baseline tx/s / best variant tx/s over the")
    print("    rounds (the least-disturbed runs); paired = median of per-round ratios")
    ratios: dict[tuple[str, int], float] = {}
    for workers in (1, 8):
        base = best[(VARIANTS[0].name, workers)]
        base_runs = per_round[(VARIANTS[0].name, workers)]
        for variant in variants:
            key = (variant.name, workers)
            ratios[key] = base / best[key]
            paired = statistics.median(
                b / v for b, v in zip(base_runs, per_round[key], strict=True)
            )
            print(
                f"  {workers} conn  {variant.name:<48} {best[key]:8.0f} tx/s"
                f"   cost {ratios[key]:.2f}x (paired {paired:.2f}x)"
            )
    return ratios


def part_b(dsn: str, url: str, rows: int, batch: int, rounds: int) -> tuple[float, float, float]:
    messages = [
        Message(
            "account-events",
            {"account": i, "delta": 1, "note": "bulk"},
            key=str(i % 997),
            event_type="balance.changed",
        )
        for i in range(rows)
    ]
    engine = sa.create_engine(url)
    outbox = Outbox(OutboxConfig(notify=False))
    set_trigger(dsn, enabled=False)

    def run_add_many() -> float:
        reset(dsn)
        started = time.perf_counter()
        for i in range(0, rows, batch):
            with engine.begin() as conn:
                outbox.add_many(conn, messages[i : i + batch])
        return rows / (time.perf_counter() - started)

    def run_add_many_prepared() -> float:
        """add_many's database part alone: rows validated and serialised beforehand."""
        reset(dsn)
        plans = [outbox._plan_many(messages[i : i + batch]) for i in range(0, rows, batch)]
        started = time.perf_counter()
        for plan in plans:
            with engine.begin() as conn:
                outbox._run(conn, plan)
        return rows / (time.perf_counter() - started)

    def run_copy() -> float:
        reset(dsn)
        prepared = [prepare(m, outbox.config) for m in messages]  # same rows, prep untimed
        copy_sql = (
            "COPY outboxkit.outbox_message (event_id, idempotency_key, content_digest, topic,"
            " message_key, payload, content_type, headers, event_type, shard) FROM STDIN"
        )
        started = time.perf_counter()
        with psycopg.connect(dsn) as conn:
            for i in range(0, rows, batch):
                with conn.transaction(), conn.cursor() as cur, cur.copy(copy_sql) as copy:
                    for r in prepared[i : i + batch]:
                        copy.write_row(
                            (
                                r.event_id,
                                r.idempotency_key,
                                r.content_digest,
                                r.topic,
                                r.message_key,
                                r.payload,
                                r.content_type,
                                r.headers,
                                r.event_type,
                                0,
                            )
                        )
        return rows / (time.perf_counter() - started)

    def run_copy_from_messages() -> float:
        """A hand-written COPY that also builds its rows (ids, JSON) from the same messages."""
        reset(dsn)
        copy_sql = (
            "COPY outboxkit.outbox_message (event_id, idempotency_key, content_digest, topic,"
            " message_key, payload, content_type, event_type, shard) FROM STDIN"
        )
        started = time.perf_counter()
        with psycopg.connect(dsn) as conn:
            for i in range(0, rows, batch):
                with conn.transaction(), conn.cursor() as cur, cur.copy(copy_sql) as copy:
                    for m in messages[i : i + batch]:
                        event_id = uuid.uuid4()
                        copy.write_row(
                            (
                                event_id,
                                str(event_id),
                                b"",
                                m.topic,
                                m.key,
                                json.dumps(m.payload).encode(),
                                "application/json",
                                m.event_type,
                                0,
                            )
                        )
        return rows / (time.perf_counter() - started)

    def run_prepare() -> float:
        started = time.perf_counter()
        for i in range(0, rows, batch):
            outbox._plan_many(messages[i : i + batch])  # what add_many does before any SQL
        return rows / (time.perf_counter() - started)

    runs: dict[str, Callable[[], float]] = {
        "add_many": run_add_many,
        "add_many_db": run_add_many_prepared,
        "copy": run_copy,
        "copy_e2e": run_copy_from_messages,
        "prepare": run_prepare,
    }
    results: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(rounds):
        for name, fn in runs.items():
            rate = fn()
            results[name].append(rate)
            print(f"  round {round_ + 1} {name:<9} {rate:9.0f} rows/s")
    engine.dispose()
    set_trigger(dsn, enabled=True)
    add_many_rate, db_rate, copy_rate, e2e_rate, prep_rate = (
        max(results[k]) for k in ("add_many", "add_many_db", "copy", "copy_e2e", "prepare")
    )
    print(f"\n(b) bulk, {rows} rows in transactions of {batch}, best of {rounds}")
    label = "add_many (validation, serialisation, digest, INSERT..unnest)"
    print(f"  {label} {add_many_rate:9.0f} rows/s")
    label = "add_many, database part only (rows prepared beforehand)"
    print(f"  {label:<61} {db_rate:9.0f} rows/s")
    print(f"  raw psycopg COPY of the same prepared rows                  {copy_rate:9.0f} rows/s")
    print(f"  raw COPY that also builds its rows (uuid4, json.dumps)     {e2e_rate:9.0f} rows/s")
    print(
        f"  add_many / COPY = {add_many_rate / copy_rate:.2f} (prepared rows),"
        f" {add_many_rate / e2e_rate:.2f} (COPY building its rows)"
    )
    print(
        f"  (Python-side preparation alone: {prep_rate:.0f} rows/s;"
        f" database part / COPY = {db_rate / copy_rate:.2f})"
    )
    return add_many_rate, copy_rate, e2e_rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per throughput measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bulk-rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000)
    args = parser.parse_args()

    with ExitStack() as stack:
        server_url = os.environ.get("OUTBOXKIT_DATABASE_URL")
        if not server_url:
            pg = PostgresServer(durable=True)
            stack.callback(pg.destroy)
            pg.start()
            server_url = pg.url
            print("PostgreSQL: self-started, durable (fsync on, synchronous_commit on)")
        name = f"outboxkit_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

        def drop() -> None:
            with psycopg.connect(server_url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))

        stack.callback(drop)
        dsn = database_url_with(server_url, name)
        migrator.upgrade(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE account (id integer PRIMARY KEY, balance bigint NOT NULL)")
            conn.execute(
                "INSERT INTO account SELECT g, 0 FROM generate_series(1, %s) g", (ACCOUNTS,)
            )
            settings = conn.execute(
                "SELECT current_setting('fsync'), current_setting('synchronous_commit'),"
                " current_setting('server_version')"
            ).fetchone()
        print(f"fsync={settings[0]} synchronous_commit={settings[1]} PostgreSQL {settings[2]}")
        print(f"CPUs: {os.cpu_count()}, Python {sys.version.split()[0]}\n")
        url = sqlalchemy_url(dsn)
        started = time.monotonic()
        best = part_a(dsn, url, args.seconds, args.rounds)
        print()
        add_many_rate, copy_rate, e2e_rate = part_b(
            dsn, url, args.bulk_rows, args.batch, args.rounds
        )
        print("\nsummary")
        for workers, goal in ((1, 1.25), (8, 1.5)):
            plain = best[(VARIANTS[1].name, workers)]
            off = best[(VARIANTS[2].name, workers)]
            on = best[(VARIANTS[3].name, workers)]
            print(
                f"  {workers} conn: outbox row costs {off:.2f}x (notify off),"
                f" {on:.2f}x (notify on); plain INSERT {plain:.2f}x; goal <= {goal}x"
            )
        print(
            f"  add_many / COPY: {add_many_rate / copy_rate:.2f} of a COPY of prepared rows,"
            f" {add_many_rate / e2e_rate:.2f} of a COPY building its rows (goal >= 0.8)"
        )
        print(f"  total {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
