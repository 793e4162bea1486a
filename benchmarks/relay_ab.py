"""Before/after in one session: variants of the relay alternated round by round, medians quoted.

Run: ``python benchmarks/relay_ab.py`` (``BENCH_ROUNDS``, default 3; ``BENCH_ROWS`` as in
``relay.py``, default there 200000 — 50000 keeps a round near two minutes). ``BENCH_BEFORE``
names a checkout of an older outboxkit (e.g. ``git archive <commit> | tar -x -C /tmp/before``):
its relay runs as the "before" variants, this checkout's as "after"; without it the variants
compare one claim per Kafka transaction with the defaults. Each round, on fresh databases of one
shard: the raw drain, then every variant, then commit -> visible latency at 1,000 events/s for
each. The order rotates every round, so in as many rounds as there are variants each variant
runs once in every position (an order that only flipped put "after" second or third of four in
every round, and an A/A run showed that slot alone lean by ~10 % in latency).
``BENCH_SHARDS4=1`` adds the defaults on 4 shards over 2 processes (against a 4-shard raw
drain; with ``BENCH_BEFORE`` for both sides). A busy machine moves single figures a lot, so
the medians over rounds are what to quote.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid

from pause_watch import PauseWatch

import relay as bench
from outboxkit.devstack import DevStack

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
BEFORE = os.environ.get("BENCH_BEFORE")
SHARDS4 = os.environ.get("BENCH_SHARDS4") == "1"
LATENCY = os.environ.get("BENCH_AB_LATENCY", "1") == "1"  # 0: throughput only (iterating)
ONE_CLAIM = {"OUTBOXKIT_RELAY_TRANSACTION_MAX_ROWS": str(bench.BATCH)}
OLD = {"PYTHONPATH": BEFORE} if BEFORE else ONE_CLAIM
# name -> (mode, extra environment of the relay process)
VARIANTS = {
    "eos-before": ("exactly_once", OLD),
    "eos-after": ("exactly_once", {}),
    "alo-before": ("at_least_once", OLD),
    "alo-after": ("at_least_once", {}),
}
if os.environ.get("BENCH_AB_ENV"):  # one more exactly-once variant: "NAME=VALUE,NAME=VALUE"
    VARIANTS["eos-after-env"] = (
        "exactly_once",
        dict(pair.split("=", 1) for pair in os.environ["BENCH_AB_ENV"].split(",")),
    )


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
        print(f"before: {BEFORE or 'one claim per transaction'}; load {os.getloadavg()}")
        bench.warm_up(server, bootstrap)
        pauses = PauseWatch()
        for n in range(ROUNDS):
            raw = bench.raw_drain(server, topic, 1)
            rates.setdefault("raw", []).append(raw)
            print(f"round {n + 1} raw drain: {raw:,.0f} rows/s", flush=True)
            pauses.warn()
            names = list(VARIANTS)
            order = names[n % len(names) :] + names[: n % len(names)]
            runs = [(name, 1, 1, *VARIANTS[name]) for name in order]
            if SHARDS4:
                raw4 = bench.raw_drain(server, topic, 4)
                rates.setdefault("raw4", []).append(raw4)
                print(f"round {n + 1} raw drain, 4 shards: {raw4:,.0f} rows/s", flush=True)
                pauses.warn()
                four = [("eos-after-4x2", 4, 2, "exactly_once", {})]
                if BEFORE:  # the 4-shard figure of both, in alternating order
                    four.insert(n % 2, ("eos-before-4x2", 4, 2, "exactly_once", OLD))
                runs += four
            for name, shards, procs, mode, extra in runs:
                rate, cpu = bench.relay_throughput(
                    server, bootstrap, topic, shards, bench.BATCH, procs, mode, extra
                )
                base = raw if shards == 1 else raw4
                rates.setdefault(name, []).append(rate)
                ratios.setdefault(name, []).append(rate / base)
                cpus.setdefault(name, []).append(cpu)
                print(
                    f"round {n + 1} {name}: {rate:,.0f} rows/s = {rate / base:.2f} x raw"
                    f" ({base:,.0f}){bench.cpu_line(cpu)}; load {os.getloadavg()[0]:.1f};"
                    f" cores stolen by the host {cpu.get('_steal', 0.0):.2f}",
                    flush=True,
                )
                pauses.warn()
            for name, shards, _, mode, extra in runs:
                if shards != 1 or not LATENCY:
                    continue
                p50, p99, missing = bench.latency(server, bootstrap, mode, extra)
                lat.setdefault(name, []).append((p50, p99))
                print(
                    f"round {n + 1} {name} latency at 1,000 events/s: p50 {p50:.1f} ms,"
                    f" p99 {p99:.1f} ms ({missing} not seen)",
                    flush=True,
                )
                pauses.warn()
        if pauses.total:
            print(f"!! the clock jumped by {pauses.total:.1f}s in all: see the warnings above")
    print("medians:")
    print(f"  raw drain: {statistics.median(rates['raw']):,.0f} rows/s")
    for name in rates:
        if name.startswith("raw"):
            continue
        cpu = {k: statistics.median(c[k] for c in cpus[name]) for k in cpus[name][0]}
        line = (
            f"  {name}: {statistics.median(rates[name]):,.0f} rows/s ="
            f" {statistics.median(ratios[name]):.2f} x raw drain{bench.cpu_line(cpu)}"
        )
        if name in lat:
            line += (
                f"; latency p50 {statistics.median(p for p, _ in lat[name]):.1f} ms,"
                f" p99 {statistics.median(q for _, q in lat[name]):.1f} ms"
            )
        print(line, flush=True)
    for side in ("before", "after") if SHARDS4 else ():
        if f"eos-{side}-4x2" not in rates:
            continue
        four, one = rates[f"eos-{side}-4x2"], rates[f"eos-{side}"]
        scale = [r4 / r1 for r4, r1 in zip(four, one, strict=True)]
        print(
            f"  4 shards over 2 processes / 1 shard (eos-{side}): {statistics.median(scale):.2f} x"
        )
    print(f"benchmark total {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
