"""Before/after in one session: one vs two transactional producers per shard, rounds alternated.

Run: ``python benchmarks/relay_ab.py`` (``BENCH_ROUNDS``, default 3; ``BENCH_ROWS`` as in
``relay.py``, default there 200000 — 50000 keeps a round near two minutes). Each round, on fresh
databases of one shard: the raw drain, exactly-once with ``producers_per_shard`` 1 and 2 (the
order flips every round), at-least-once, then commit -> visible latency at 1,000 events/s for
each. A busy machine moves single figures a lot, so the medians over rounds are what to quote.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid

import relay as bench
from outboxkit.devstack import DevStack

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
VARIANTS = {"eos-1": ("exactly_once", "1"), "eos-2": ("exactly_once", "2")}


def env(producers: str) -> dict[str, str]:
    return {"OUTBOXKIT_RELAY_PRODUCERS_PER_SHARD": producers}


def main() -> None:
    started = time.monotonic()
    rates: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    lat: dict[str, list[tuple[float, float]]] = {}
    cpus: dict[str, list[dict[str, float]]] = {}
    with DevStack(durable=True) as stack:
        server, bootstrap = stack.database_url, stack.kafka_bootstrap
        bench.watch_services(stack)
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        bench.create_topic(bootstrap, topic, 4)
        print(f"{ROUNDS} rounds, backlog {bench.ROWS} rows of 500 bytes, 1 shard, batch 500")
        for n in range(ROUNDS):
            raw = bench.raw_drain(server, topic, 1)
            rates.setdefault("raw", []).append(raw)
            order = list(VARIANTS) if n % 2 == 0 else list(reversed(VARIANTS))
            runs = [(name, *VARIANTS[name]) for name in order]
            runs.append(("alo", "at_least_once", "1"))
            for name, mode, producers in runs:
                rate, cpu = bench.relay_throughput(
                    server, bootstrap, topic, 1, 500, 1, mode, env(producers)
                )
                rates.setdefault(name, []).append(rate)
                ratios.setdefault(name, []).append(rate / raw)
                cpus.setdefault(name, []).append(cpu)
                print(
                    f"round {n + 1} {name}: {rate:,.0f} rows/s = {rate / raw:.2f} x raw"
                    f" ({raw:,.0f}){bench.cpu_line(cpu)}",
                    flush=True,
                )
            for name, mode, producers in runs:
                p50, p99, missing = bench.latency(server, bootstrap, mode, env(producers))
                lat.setdefault(name, []).append((p50, p99))
                print(
                    f"round {n + 1} {name} latency at 1,000 events/s: p50 {p50:.1f} ms,"
                    f" p99 {p99:.1f} ms ({missing} not seen)",
                    flush=True,
                )
    print("medians:")
    print(f"  raw drain: {statistics.median(rates['raw']):,.0f} rows/s")
    for name in (*VARIANTS, "alo"):
        cpu = {k: statistics.median(c[k] for c in cpus[name]) for k in cpus[name][0]}
        print(
            f"  {name}: {statistics.median(rates[name]):,.0f} rows/s ="
            f" {statistics.median(ratios[name]):.2f} x raw drain{bench.cpu_line(cpu)};"
            f" latency p50 {statistics.median(p for p, _ in lat[name]):.1f} ms,"
            f" p99 {statistics.median(q for _, q in lat[name]):.1f} ms",
            flush=True,
        )
    print(f"benchmark total {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
