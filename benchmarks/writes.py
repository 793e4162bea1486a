"""What the outbox costs an application transaction, and how fast bulk writes go: old vs new.

Run: ``python benchmarks/writes.py [--old PATH]`` (starts its own durable PostgreSQL unless
``OUTBOXKIT_DATABASE_URL`` names a server; then a scratch database is created on it and dropped).
``--old`` names a checkout of an earlier outboxkit (e.g. ``git worktree add /tmp/old v0.1``): its
writer runs in the same rounds, next to this one, so both see the same machine load.

(a) Transactions/s of an application transaction that updates one business row: alone, with a
    ``SELECT 1`` (what one more statement and its round trip cost, whatever it does), with a
    hand-written INSERT, and with one outbox row (notify off and on; old and new writer), at 1
    and 8 connections (worker processes, so Python's GIL is not the limit). Every round measures
    every variant back to back, in a rotating order; a variant's cost is the median over rounds
    of (business-only tx/s / variant tx/s) of the same round, which cancels most of the drift of
    a shared machine.
(b) ``add_many`` rows/s (old and new) against a raw psycopg ``COPY`` of the same prepared rows.
Nothing here asserts on speed; it prints numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from outboxkit.db import migrator
from outboxkit.devstack import PostgresServer
from outboxkit.devstack.postgres import database_url_with, sqlalchemy_url
from outboxkit.events import Event, Message
from outboxkit.outbox import Outbox, OutboxConfig
from outboxkit.outbox_plan import prepare

HERE = Path(__file__).resolve().parent
ACCOUNTS = 10_000
BASE = ("new", "base")
# (code, variant): code "new" is this checkout, "old" the one given with --old.
VARIANTS = [
    BASE,
    ("new", "select1"),
    ("new", "plain"),
    ("old", "notify_off"),
    ("new", "notify_off"),
    ("old", "notify_on"),
    ("new", "notify_on"),
    ("new", "pipelined"),
]
LABELS = {
    "base": "business update only",
    "select1": "+ SELECT 1 (any second statement's floor)",
    "plain": "+ hand-written plain INSERT (reference)",
    "notify_off": "+ outbox row, notify off",
    "notify_on": "+ outbox row, notify on",
    "pipelined": "+ outbox row, INSERT+COMMIT in one round trip (experiment)",
}


class Worker:
    """A write_worker.py process importing outboxkit from ``code_dir``."""

    def __init__(self, url: str, code_dir: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(code_dir)}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "write_worker.py"), url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.read()

    def send(self, obj: dict[str, Any] | str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark worker exited ({self.proc.wait()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def close(self) -> None:
        self.send({"cmd": "exit"})
        self.proc.wait(timeout=60)


def run(workers: list[Worker], command: dict[str, Any]) -> list[Any]:
    """Start ``command`` on every worker, release them together, collect their answers."""
    for i, w in enumerate(workers):
        w.send({**command, "index": i, "workers": len(workers)})
    for w in workers:
        w.read()  # ready (warmed up)
    for w in workers:
        w.send("go")
    return [w.read()["done"] for w in workers]


def reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE outboxkit.outbox_message")
        conn.execute("VACUUM ANALYZE outboxkit.outbox_message")
        conn.execute("VACUUM ANALYZE account")
        conn.execute("CHECKPOINT")


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def part_a(dsn: str, pools: dict[str, list[Worker]], seconds: float, rounds: int) -> None:
    variants = [v for v in VARIANTS if v[0] in pools]
    tps: dict[tuple[int, str, str], list[float]] = {}
    cpu: dict[tuple[int, str, str], list[float]] = {}  # client + server CPU s per transaction
    for round_ in range(rounds):
        reset(dsn)
        for conns in (1, 8):
            shift = round_ % len(variants)
            for code, variant in variants[shift:] + variants[:shift]:
                done = run(
                    pools[code][:conns], {"cmd": "tx", "variant": variant, "seconds": seconds}
                )
                count = sum(d[0] for d in done)
                tps.setdefault((conns, code, variant), []).append(count / seconds)
                cpu.setdefault((conns, code, variant), []).append(
                    sum(d[1] for d in done) / 1e9 / max(count, 1)
                )
        load = os.getloadavg()[0]
        print(f"  round {round_ + 1}/{rounds} done, load average {load:.1f}", flush=True)
    print("\n(a) application transaction; cost = variant / business update only, by throughput")
    print("    and by CPU time per transaction (client process + its PostgreSQL backend, which a")
    print("    busy machine disturbs less). paired: median over rounds of the same round's ratio")
    print("    (min-max); best: best round of each (the least disturbed; noise only slows)")
    for conns in (1, 8):
        base, base_cpu = tps[(conns, *BASE)], cpu[(conns, *BASE)]
        for code, variant in variants:
            runs, runs_cpu = tps[(conns, code, variant)], cpu[(conns, code, variant)]
            ratio = [b / v for b, v in zip(base, runs, strict=True)]
            cpu_ratio = [v / b for b, v in zip(base_cpu, runs_cpu, strict=True)]
            label = LABELS[variant] + (f" [{code}]" if variant.startswith("notify") else "")
            print(
                f"  {conns} conn  {label:<56} {max(runs):6.0f} tx/s best;"
                f" cost paired {_summary(ratio)}, best {max(base) / max(runs):.2f}x;"
                f"  {min(runs_cpu) * 1e6:5.0f} us CPU/tx best;"
                f" CPU cost paired {_summary(cpu_ratio)}, best {min(runs_cpu) / min(base_cpu):.2f}x"
            )


def _bulk_messages(rows: int) -> list[Message]:
    return [
        Message("account-events", {"account": i, "delta": 1, "note": "bulk"}, key=str(i % 997))
        for i in range(rows)
    ]


def run_copy(dsn: str, rows: int, batch: int) -> list[float]:
    """A raw psycopg COPY of the same rows, validated and serialised beforehand (untimed)."""
    config = OutboxConfig(notify=False)
    prepared = [prepare(m, config) for m in _bulk_messages(rows)]
    copy_sql = (
        "COPY outboxkit.outbox_message (event_id, idempotency_key, content_digest, topic,"
        " message_key, payload, content_type, headers, event_type, shard) FROM STDIN"
    )
    with psycopg.connect(dsn) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        conn.commit()

        def used() -> int:
            with open(f"/proc/{pid}/schedstat") as f:
                return time.process_time_ns() + int(f.read().split()[0])

        cpu, started = used(), time.perf_counter()
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
        return [rows / (time.perf_counter() - started), (used() - cpu) / rows]


class BalanceChanged(Event, topic="account-events", key="account", event_type="balance.changed"):
    """The bulk rows as a typed event (``add_many`` of events, as the flush hook writes them)."""

    account: str
    delta: int
    note: str


def run_prepare(rows: int, batch: int, typed: bool = False) -> float:
    """This checkout's Python side of add_many alone (validation, serialisation, digest)."""
    outbox = Outbox(OutboxConfig(notify=False))
    messages: list[Message] | list[BalanceChanged] = _bulk_messages(rows)
    if typed:
        messages = [BalanceChanged(account=str(i % 997), delta=1, note="bulk") for i in range(rows)]
    started = time.perf_counter()
    for i in range(0, rows, batch):
        outbox._plan_many(messages[i : i + batch])
    return rows / (time.perf_counter() - started)


def part_b(dsn: str, pools: dict[str, list[Worker]], rows: int, batch: int, rounds: int) -> None:
    names = [f"add_many [{code}]" for code in ("old", "new") if code in pools]
    names += ["add_many [new, INSERT only]", "COPY"]
    rates: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}  # ns per row
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            reset(dsn)
            if name == "COPY":
                rate, per_row = run_copy(dsn, rows, batch)
            else:
                code = name.split("[")[1].rstrip("]").split(",")[0]
                config = {"copy_min_rows": None} if "INSERT only" in name else {}
                command = {"cmd": "bulk", "rows": rows, "batch": batch, "config": config}
                [(rate, per_row)] = run(pools[code][:1], command)
            rates[name].append(rate)
            cpu[name].append(per_row)
    prep = statistics.median(run_prepare(rows, batch) for _ in range(rounds))
    prep_typed = statistics.median(run_prepare(rows, batch, typed=True) for _ in range(rounds))
    print(f"\n(b) bulk, {rows} rows in transactions of {batch}, {rounds} rounds; share of COPY")
    print("    by throughput and by CPU time per row (client + its backend); paired and best")
    copy, copy_cpu = rates["COPY"], cpu["COPY"]
    for name in names:
        share = [r / c for r, c in zip(rates[name], copy, strict=True)]
        cpu_share = [c / r for r, c in zip(cpu[name], copy_cpu, strict=True)]
        extra = (
            ""
            if name == "COPY"
            else f"; rows/s {_summary(share).replace('x', '', 1)}, best"
            f" {max(rates[name]) / max(copy):.2f}; CPU {_summary(cpu_share).replace('x', '', 1)},"
            f" best {min(copy_cpu) / min(cpu[name]):.2f}"
        )
        print(
            f"  {name:<28} {max(rates[name]):7.0f} rows/s best,"
            f" {min(cpu[name]) / 1e3:5.1f} us CPU/row best{extra}"
        )
    print(
        f"  (Python side of add_many [new] alone: {prep:.0f} rows/s;"
        f" of typed events: {prep_typed:.0f} rows/s)"
    )


@contextmanager
def scratch_database() -> Iterator[str]:
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
        yield database_url_with(server_url, name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="checkout of an earlier outboxkit to compare")
    parser.add_argument("--seconds", type=float, default=1.5, help="per throughput measurement")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--bulk-rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--skip", choices=["a", "b"], help="leave out one part")
    args = parser.parse_args()

    with scratch_database() as dsn, ExitStack() as stack:
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
        assert settings is not None
        print(f"fsync={settings[0]} synchronous_commit={settings[1]} PostgreSQL {settings[2]}")
        print(
            f"CPUs: {os.cpu_count()}, Python {sys.version.split()[0]},"
            f" load average at start {os.getloadavg()[0]:.1f}\n"
        )
        url = sqlalchemy_url(dsn)
        dirs = {"new": HERE.parent} | ({"old": args.old.resolve()} if args.old else {})
        pools: dict[str, list[Worker]] = {}
        for code, code_dir in dirs.items():
            pools[code] = [Worker(url, code_dir) for _ in range(8)]
            for w in pools[code]:
                stack.callback(w.close)
        started = time.monotonic()
        if args.skip != "a":
            part_a(dsn, pools, args.seconds, args.rounds)
        if args.skip != "b":
            part_b(dsn, pools, args.bulk_rows, args.batch, args.rounds)
        print(
            f"\ntotal {time.monotonic() - started:.0f}s,"
            f" load average at the end {os.getloadavg()[0]:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
