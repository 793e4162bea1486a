"""The two measurements, the same code for both systems.

Throughput: a backlog of N committed rows is in the database (and, for Debezium, in its slot)
before the system starts. The clock starts at the broker's append time of the first record and
stops when a read_committed reader has seen all N distinct events; start-up (JVM, Python import,
connector start) is outside it. events/s = N / that span.

Latency: outboxkit's writer commits 10 events every 10 ms (1,000 events/s) for a warm-up and then
the measured seconds; each event's commit time (after COMMIT returned) is compared with its
arrival at a read_committed reader in the same process (one monotonic clock).
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks.debezium import cpu
from benchmarks.debezium.systems import System
from benchmarks.debezium.workload import (
    Reader,
    create_database,
    create_topic,
    drop_database,
    fill,
    steady_writer,
)


@dataclass(frozen=True)
class Services:
    server_url: str  # the maintenance database; each run creates its own database
    bootstrap: str
    pids: dict[str, int | None]  # "postgresql", "kafka": for CPU accounting


def _cpu_pids(services: Services, system: System) -> dict[str, int | None]:
    return {"system": system.pid, **services.pids}


def throughput(services: Services, system: System, rows: int) -> dict[str, Any]:
    url = create_database(services.server_url, "tp")
    topic = f"dbz-bench-tp-{uuid.uuid4().hex[:8]}"
    try:
        create_topic(services.bootstrap, topic)
        system.prepare(url)
        fill_seconds = fill(url, topic, rows)
        reader = Reader(services.bootstrap, topic, system.id_header).start()
        load_before = cpu.loadavg()
        # Before the start: the relay process does not exist yet (0 s), the Connect worker does.
        base = cpu.sample(_cpu_pids(services, system))
        system.start(url, services.bootstrap)
        try:
            done = reader.wait_for(rows, timeout=max(600.0, rows / 50))
            used = cpu.delta(base, cpu.sample(_cpu_pids(services, system)))
        finally:
            reader.stop()
            system.stop()
        if done is None or reader.first_append_ms is None:
            raise RuntimeError(
                f"{system.name} {system.mode}: only {len(reader.seen)} of {rows} events arrived"
            )
        span = done - reader.first_append_ms / 1000
        result: dict[str, Any] = {
            "rows": rows,
            "events_per_s": round(rows / span, 1),
            "seconds": round(span, 3),
            "records_read": reader.records,
            "duplicates_read": reader.records - len(reader.seen),
            "fill_seconds": round(fill_seconds, 2),
            "cpu_seconds": used,
            "cpu_seconds_per_100k_rows": {k: round(v * 100_000 / rows, 2) for k, v in used.items()},
            "loadavg_before": load_before,
            "loadavg_after": cpu.loadavg(),
        }
        if system.name != "Debezium":
            result["relay_published_at_rate"] = _published_rate(url)
        return result
    finally:
        drop_database(services.server_url, url)


def _published_rate(url: str) -> float | None:
    """The relay's own clock (first to last ``published_at``), as benchmarks/relay.py reports."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(published_at) - min(published_at))"
            " FROM outboxkit.outbox_message WHERE state = 'published'"
        ).fetchone()
    if row is None or not row[1]:
        return None
    return round(int(row[0]) / float(row[1]), 1)


def _wait_visible(url: str, topic: str, reader: Reader) -> None:
    """One probe event through the whole path, so the timed writes find the system running."""
    probe: dict[str, float] = {}
    steady_writer(url, topic, rate=100, seconds=0.001, committed=probe)
    if reader.wait_for(len(probe), timeout=120) is None:
        raise RuntimeError("the probe event did not arrive within 120 s")


def latency(
    services: Services, system: System, rate: int, seconds: float, warmup: float
) -> dict[str, Any]:
    url = create_database(services.server_url, "lat")
    topic = f"dbz-bench-lat-{uuid.uuid4().hex[:8]}"
    try:
        create_topic(services.bootstrap, topic)
        system.prepare(url)
        reader = Reader(services.bootstrap, topic, system.id_header).start()
        system.start(url, services.bootstrap)
        try:
            _wait_visible(url, topic, reader)
            warm: dict[str, float] = {}
            steady_writer(url, topic, rate, warmup, warm)
            committed: dict[str, float] = {}
            pids = _cpu_pids(services, system)
            base, load_before = cpu.sample(pids), cpu.loadavg()
            started = time.monotonic()
            steady_writer(url, topic, rate, seconds, committed)
            elapsed = time.monotonic() - started
            used = cpu.delta(base, cpu.sample(pids))
            reader.wait_for(len(warm) + len(committed) + 1, timeout=30)
        finally:
            reader.stop()
            system.stop()
        samples = sorted(
            (reader.seen[e] - at) * 1000 for e, at in committed.items() if e in reader.seen
        )
        if not samples:
            raise RuntimeError(f"{system.name} {system.mode}: no timed event arrived")
        return {
            "events": len(committed),
            "events_per_s_written": round(len(committed) / elapsed, 1),
            "missing": len(committed) - len(samples),
            "duplicates_read": reader.records - len(reader.seen),
            "p50_ms": round(statistics.median(samples), 1),
            "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))], 1),
            "max_ms": round(samples[-1], 1),
            "cpu_seconds": used,
            "loadavg_before": load_before,
            "loadavg_after": cpu.loadavg(),
        }
    finally:
        drop_database(services.server_url, url)
