"""What waiting for the database costs on this machine, apart from the database's own work.

Run: ``python benchmarks/wait_cost.py`` (starts its own PostgreSQL unless
``OUTBOXKIT_DATABASE_URL`` names a server). One connection sends ``SELECT 1`` and waits for the
answer two ways, alternating: as psycopg does (the thread sleeps in the kernel until the socket
is readable) and by polling the socket without sleeping. After each answer it times the writer's
preparation of one message (``outboxkit.outbox_plan.prepare``, thread CPU time), and once more
with no wait before it. On a machine whose idle CPU wakes slowly (a virtual machine without
guest halt-polling), a sleeping wait adds tens of microseconds to every round trip, and the
Python that runs right after it is several times slower than the same code run back to back,
which is why per-call figures measured in a loop ("micro") understate what the same code costs
between statements. Medians; nothing here asserts on speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import psycopg

from outboxkit.devstack import PostgresServer
from outboxkit.events import Message
from outboxkit.outbox import OutboxConfig
from outboxkit.outbox_plan import prepare

CONFIG = OutboxConfig(notify=False)
MESSAGE = Message("account-events", {"account": 5, "delta": 1}, key="5", event_type="changed")


def _sleeping(conn: psycopg.Connection[object]) -> Callable[[], None]:
    def once() -> None:
        conn.execute("SELECT 1")

    return once


def _polling(conn: psycopg.Connection[object]) -> Callable[[], None]:
    pgconn = conn.pgconn

    def once() -> None:
        pgconn.send_query(b"SELECT 1")
        while pgconn.flush():  # a short query: sent at once, but do not assume it
            pass
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
        while pgconn.get_result() is not None:
            pass

    return once


def _rounds(wait: Callable[[], None] | None, n: int) -> tuple[float, float]:
    """Median round trip (us, 0 without one) and median thread CPU of one prepare after it."""
    trips, prepares = [], []
    for _ in range(n):
        if wait is not None:
            started = time.perf_counter_ns()
            wait()
            trips.append(time.perf_counter_ns() - started)
        cpu = time.thread_time_ns()
        prepare(MESSAGE, CONFIG)
        prepares.append(time.thread_time_ns() - cpu)
    trip = statistics.median(trips) / 1000 if trips else 0.0
    return trip, statistics.median(prepares) / 1000


def run(url: str, rounds: int, calls: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        variants = {"sleeping": _sleeping(conn), "polling": _polling(conn), "no wait": None}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        for round_no in range(rounds):
            names = list(variants) if round_no % 2 == 0 else list(reversed(variants))
            for name in names:
                results[name].append(_rounds(variants[name], calls))
    print(f"{rounds} alternating rounds of {calls} calls; medians of the rounds' medians")
    for name, rows in results.items():
        trip = statistics.median(r[0] for r in rows)
        prep = statistics.median(r[1] for r in rows)
        trip_text = f"SELECT 1 round trip {trip:6.1f} us" if trip else " " * 29
        print(f"  {name:9} {trip_text}   prepare() after it {prep:5.1f} us CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    external = os.environ.get("OUTBOXKIT_DATABASE_URL")
    if external:
        run(external, args.rounds, args.calls)
        return
    server = PostgresServer(durable=False)
    server.start()
    try:
        run(server.url, args.rounds, args.calls)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
