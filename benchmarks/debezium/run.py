"""outboxkit's relay and Debezium's outbox router side by side: one table, one JSON file.

Run: ``make bench-debezium`` (or ``python -m benchmarks.debezium`` from the repository root).
Starts its own durable PostgreSQL (fsync on, wal_level=logical) and Kafka, fetches Kafka Connect
and Debezium from Maven Central once, and writes ``benchmarks/results/debezium.json``.

Settings (environment): ``BENCH_ROWS`` backlog size (50000), ``BENCH_LATENCY_SECONDS`` measured
seconds per latency run (20), ``BENCH_WARMUP_SECONDS`` (3), ``BENCH_RATE`` events/s (1000),
``BENCH_DEBEZIUM_POLL_MS`` Debezium ``poll.interval.ms`` values to run (``500,10``),
``BENCH_ROUNDS`` backlog rounds per system (3; the table shows the median),
``BENCH_DEBEZIUM_EXACTLY_ONCE=0`` skips the exactly-once Debezium run (a distributed worker).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import time
from pathlib import Path
from types import FrameType
from typing import Any

import confluent_kafka
import psycopg

from benchmarks.debezium import cpu
from benchmarks.debezium.connect import ConnectWorker, java
from benchmarks.debezium.jars import PLUGIN_NAME, ConnectJars, connect_jars
from benchmarks.debezium.measure import Services, latency, throughput
from benchmarks.debezium.systems import DebeziumOutbox, OutboxkitRelay, System
from benchmarks.debezium.workload import KEYS, PARTITIONS, PAYLOAD_BYTES
from outboxkit import __version__ as outboxkit_version
from outboxkit.devstack import (
    DATABASE_URL_ENV,
    KAFKA_BOOTSTRAP_ENV,
    KAFKA_VERSION,
    DevStack,
    PostgresServer,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "debezium.json"

ROWS = int(os.environ.get("BENCH_ROWS", "50000"))
LATENCY_SECONDS = float(os.environ.get("BENCH_LATENCY_SECONDS", "20"))
WARMUP_SECONDS = float(os.environ.get("BENCH_WARMUP_SECONDS", "3"))
RATE = int(os.environ.get("BENCH_RATE", "1000"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
WARMUP_ROWS = min(20_000, ROWS)
DEBEZIUM_EXACTLY_ONCE = os.environ.get("BENCH_DEBEZIUM_EXACTLY_ONCE", "1") != "0"
EXACTLY_ONCE_POLL_MS = 10
DEBEZIUM_POLL_MS = [
    int(p) for p in os.environ.get("BENCH_DEBEZIUM_POLL_MS", "500,10").split(",") if p.strip()
]


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM unwinds like Ctrl-C, so every started process is stopped on the way out."""
    raise SystemExit(128 + signum)


def machine() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "loadavg_at_start": cpu.loadavg(),
    }


def versions(server_url: str, worker: ConnectWorker) -> dict[str, Any]:
    with psycopg.connect(server_url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    plugins = worker.request("GET", "/connector-plugins")
    debezium = next(p["version"] for p in plugins if p["class"].startswith("io.debezium"))
    java_out = subprocess.run([java(), "-version"], capture_output=True, text=True, check=False)
    return {
        "outboxkit": outboxkit_version,
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "postgresql": row[0] if row else None,
        "kafka_broker": KAFKA_VERSION,
        "kafka_connect": worker.request("GET", "/")["version"],
        "debezium_connector_postgres": debezium,
        "java": java_out.stderr.splitlines()[0] if java_out.stderr else None,
    }


def measure_throughput(services: Services, system: System, entry: dict[str, Any]) -> None:
    result = throughput(services, system, ROWS)
    entry.setdefault("throughput_rounds", []).append(result)
    rates = [r["events_per_s"] for r in entry["throughput_rounds"]]
    entry["events_per_s"] = round(statistics.median(rates), 1)
    print(
        f"  {system.name} [{system.mode}] backlog of {ROWS}: {result['events_per_s']:,.0f}"
        f" events/s in {result['seconds']:.1f} s, CPU s {result['cpu_seconds']},"
        f" load {result['loadavg_before'][0]}",
        flush=True,
    )


def measure_latency(services: Services, system: System, entry: dict[str, Any]) -> None:
    lat = entry["latency"] = latency(services, system, RATE, LATENCY_SECONDS, WARMUP_SECONDS)
    print(
        f"  {system.name} [{system.mode}] at {lat['events_per_s_written']:,.0f} events/s:"
        f" p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms, {lat['missing']} missing,"
        f" CPU s {lat['cpu_seconds']}, load {lat['loadavg_before'][0]}",
        flush=True,
    )
    if lat["events_per_s_written"] < 0.95 * RATE:
        print(f"  (the writer fell behind {RATE} events/s: the machine is saturated)")


def run_all(
    services: Services, postgres: PostgresServer, jars: ConnectJars
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every system: a warm-up, the backlog rounds (order reversed every other round), latency."""
    with contextlib.ExitStack() as stack:
        standalone = stack.enter_context(ConnectWorker(jars, services.bootstrap))
        systems: list[System] = [OutboxkitRelay("exactly_once"), OutboxkitRelay("at_least_once")]
        systems += [DebeziumOutbox(standalone, postgres, ms) for ms in DEBEZIUM_POLL_MS]
        warm_up = [systems[0], systems[-1]]
        if DEBEZIUM_EXACTLY_ONCE:
            distributed = stack.enter_context(
                ConnectWorker(jars, services.bootstrap, distributed=True)
            )
            systems.append(DebeziumOutbox(distributed, postgres, EXACTLY_ONCE_POLL_MS))
            warm_up.append(systems[-1])
        found = versions(services.server_url, standalone)
        results = [{"system": s.name, "mode": s.mode, **s.settings} for s in systems]
        print("warm-up (not measured): broker, relay and each Connect worker", flush=True)
        for system in warm_up:
            throughput(services, system, WARMUP_ROWS)
        for round_ in range(ROUNDS):
            print(f"backlog, round {round_ + 1} of {ROUNDS}", flush=True)
            order = list(zip(systems, results, strict=True))
            for system, entry in order if round_ % 2 == 0 else reversed(order):
                measure_throughput(services, system, entry)
        print("latency", flush=True)
        for system, entry in zip(systems, results, strict=True):
            measure_latency(services, system, entry)
    return found, results


def table(results: list[dict[str, Any]]) -> str:
    head = ("system", "mode", "events/s", "p50 ms", "p99 ms", "events/s of each round")
    rows = [
        (
            r["system"],
            r["mode"],
            f"{r['events_per_s']:,.0f}",
            f"{r['latency']['p50_ms']:.1f}",
            f"{r['latency']['p99_ms']:.1f}",
            ", ".join(f"{t['events_per_s']:,.0f}" for t in r["throughput_rounds"]),
        )
        for r in results
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]
    lines = [" | ".join(str(c).ljust(w) for c, w in zip(head, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    lines += [" | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    jars = connect_jars()  # before the services: a refused download fails fast
    info = machine()
    print(
        f"{ROWS} rows of {PAYLOAD_BYTES}-byte JSON over {KEYS} keys, {PARTITIONS} partitions;"
        f" latency at {RATE} events/s for {LATENCY_SECONDS:.0f} s (after {WARMUP_SECONDS:.0f} s"
        f" warm-up); {info['nproc']} CPUs, load {info['loadavg_at_start']}",
        flush=True,
    )
    for name in (DATABASE_URL_ENV, KAFKA_BOOTSTRAP_ENV):
        if os.environ.pop(name, None):
            print(f"{name} ignored: this benchmark starts its own services (durable PostgreSQL)")
    with DevStack(durable=True) as stack:
        assert stack.postgres is not None
        assert stack.kafka is not None
        services = Services(
            stack.database_url,
            stack.kafka_bootstrap,
            {
                "postgresql": stack.postgres.service.pid if stack.postgres.service else None,
                "kafka": stack.kafka.service.pid if stack.kafka.service else None,
            },
        )
        found, results = run_all(services, stack.postgres, jars)
    document = {
        "benchmark": "outboxkit relay vs Debezium outbox EventRouter, same PostgreSQL and Kafka",
        "workload": {
            "rows": ROWS,
            "payload_bytes": PAYLOAD_BYTES,
            "keys": KEYS,
            "partitions": PARTITIONS,
            "fill_rows_per_transaction": 500,
            "latency_rate_events_per_s": RATE,
            "latency_seconds": LATENCY_SECONDS,
            "latency_warmup_seconds": WARMUP_SECONDS,
            "throughput_rounds": ROUNDS,
            "warmup_rows_per_system": WARMUP_ROWS,
            "postgresql_durable": True,
        },
        "machine": info,
        "versions": found,
        "debezium_plugin": PLUGIN_NAME,
        "connect_heap": "-Xmx1g",
        "results": results,
        "total_seconds": round(time.monotonic() - started, 1),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")
    print()
    print(table(results))
    print(f"\nwritten {RESULTS.relative_to(ROOT)}; total {document['total_seconds']:.0f} s")


if __name__ == "__main__":
    main()
