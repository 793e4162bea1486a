"""Relay benchmark: throughput against the raw database drain and a bare producer; latency.

Run: ``python benchmarks/relay.py`` (starts its own PostgreSQL with fsync on and Kafka unless
OUTBOXKIT_DATABASE_URL / OUTBOXKIT_KAFKA_BOOTSTRAP are set). ``BENCH_ROWS`` (default 200000)
sets the backlog size; ``BENCH_LATENCY_SECONDS`` (default 10) the length of each latency run;
``OUTBOXKIT_KAFKA_CLIENT`` (confluent or aiokafka) the relay's Kafka client.

Measured, each on a fresh database, in this order:
- first a warm-up, not counted: an exactly-once drain of ``BENCH_WARMUP_ROWS`` (default 50000;
  0: none) and ``BENCH_WARMUP_SECONDS`` (default 30) of the latency load, so the broker's JIT
  warm-up (thousands of transactions) does not fall on whichever measured run comes first;
- then ``BENCH_ROUNDS`` rounds (default 3, about 7 minutes in all; 1 for a quick look), each:
  - raw drain: the relay's own claim + mark SQL in batches of 500, no Kafka (1 and 4 shards,
    each before the first relay run of its shard count);
  - relay: ``outboxkit relay run`` as separate processes (exactly-once with the default adaptive
    claims, 500 growing to 2000, and with fixed claims of 500; at-least-once with the defaults,
    on 1 shard; exactly-once on 4 shards shared by 2 processes), rate = rows / (last
    published_at - first published_at), the same clock as the raw drain; each relay's own stage
    figures (transactions, claims per transaction, waits) are printed under its line. Every
    other round runs these in reverse order;
  - latency: a writer commits 1,000 events/s (10 per transaction every 10 ms); a read_committed
    consumer timestamps arrival; p50/p99 of commit -> visible, at-least-once then exactly-once;
- bare producer: confluent-kafka, idempotent, acks=all, the same 500-byte messages (the relay's
  rates of round 1 are divided by it);
- last, the acceptance figures next to their goals. Each ratio is taken within a round (the
  relay against that round's raw drain, 4 shards against that round's 1 shard); with several
  rounds each goal is printed as the median of the rounds' figures, with every round's figure,
  how many rounds met it, and how many rounds met every measured goal at once. Single runs on
  this machine move by 10-20 %, so one round decides nothing close to a goal.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pause_watch import PauseWatch  # noqa: E402
from proc_cpu import (  # noqa: E402
    machine_busy,
    machine_steal,
    own_seconds,
    per_100k,
    process_seconds,
    tree_seconds,
)

from outboxkit import db  # noqa: E402
from outboxkit.db.migrator import upgrade  # noqa: E402
from outboxkit.devstack import DevStack  # noqa: E402
from outboxkit.devstack.postgres import database_url_with  # noqa: E402
from outboxkit.schema import notify_channel  # noqa: E402

ROWS = int(os.environ.get("BENCH_ROWS", "200000"))
STAGES = os.environ.get("BENCH_STAGES", "1") == "1"  # print each relay's stage figures
# While iterating: BENCH_SKIP_RUNS="1,3" leaves out throughput runs by number (0-3, see main),
# BENCH_BARE=0 the bare producer, BENCH_LATENCY_SECONDS=0 the latency runs. Default: all.
SKIP_RUNS = {int(n) for n in os.environ.get("BENCH_SKIP_RUNS", "").split(",") if n}
# Relay runs that are not counted, first (see warm_up); 0 leaves them out.
WARMUP_ROWS = int(os.environ.get("BENCH_WARMUP_ROWS", "50000"))
WARMUP_SECONDS = float(os.environ.get("BENCH_WARMUP_SECONDS", "30"))
BARE = os.environ.get("BENCH_BARE", "1") == "1"
LATENCY_SECONDS = float(os.environ.get("BENCH_LATENCY_SECONDS", "10"))
# Whole rounds (throughput and latency runs, each ratio from runs of the same round): the goals
# are then printed as medians over the rounds, with every round's figure and how many met it.
ROUNDS = max(1, int(os.environ.get("BENCH_ROUNDS", "3")))
BATCH = 500
KEYS = 1000
MAX_BYTES = 16 * 1024 * 1024  # the relay's default max_batch_bytes (500 rows stay far below)
# Server pids of the stack's PostgreSQL and Kafka (set by main), for CPU seconds from /proc.
SERVICE_PIDS: dict[str, int] = {}
LOGS: dict[int, str] = {}  # relay pid -> its log file
PAYLOAD_SQL = "convert_to(json_build_object('n', g, 'pad', repeat('x', 480))::text, 'UTF8')"


def fresh_database(server_url: str, shards: int) -> str:
    name = f"relay_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = database_url_with(server_url, name)
    upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE outboxkit.outbox_setting SET shard_count = %s", (shards,))
    return url


def drop_database(server_url: str, url: str) -> None:
    name = url.rsplit("/", 1)[1].split("?")[0]
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def fill(url: str, topic: str, rows: int) -> None:
    """The backlog: ``rows`` pending rows with 500-byte JSON payloads over 1,000 keys."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"""
            INSERT INTO outboxkit.outbox_message
                (event_id, idempotency_key, content_digest, topic, message_key, payload, shard)
            SELECT e, 'bench-' || e, sha256(p), %(topic)s, k,  p,
                   outboxkit.outbox_shard(k, e, (SELECT shard_count FROM outboxkit.outbox_setting))
            FROM (SELECT gen_random_uuid() AS e, 'key-' || (g %% {KEYS}) AS k, {PAYLOAD_SQL} AS p
                  FROM generate_series(1, %(rows)s) AS g) s
            """,
            {"topic": topic, "rows": rows},
        )
        conn.execute("VACUUM ANALYZE outboxkit.outbox_message")


def published_span(url: str) -> tuple[int, float]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*), extract(epoch FROM max(published_at) - min(published_at))"
            " FROM outboxkit.outbox_message WHERE state = 'published'"
        ).fetchone()
    assert row is not None
    return int(row[0]), float(row[1] or 0.0)


def wait_drained(
    url: str, rows: int, timeout: float = 600, procs: list[subprocess.Popen[bytes]] | None = None
) -> None:
    """Until no row is pending. One connection and one probe of the pending index per check
    (``ORDER BY shard, id LIMIT 1``: an EXISTS was planned as a table scan, with statistics from
    before the drain): a new connection and a count over the whole table every half second cost
    PostgreSQL about 1.9 CPU seconds per 100k rows, which the relay then competed with and the
    raw drain never paid."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT 1 FROM outboxkit.outbox_message WHERE state = 'pending'"
                " ORDER BY shard, id LIMIT 1"
            ).fetchone()
            if row is None:
                count, _ = published_span(url)
                if count < rows:
                    raise RuntimeError(f"drained with {count} of {rows} rows published")
                return
            for proc in procs or []:
                if proc.poll() is not None:
                    raise RuntimeError(f"relay exited with {proc.returncode}: {LOGS[proc.pid]}")
            time.sleep(0.5)
    raise RuntimeError("drain did not finish in time")


async def raw_drain_shard(url: str, shard: int) -> None:
    """The relay's claim + mark statements, with a lease, and nothing else."""
    async with await db.connect_async(url) as conn:
        token_row = await db.one_async(
            conn,
            db.query("relay", "lease_acquire", "outboxkit"),
            {"group": "raw", "shard": shard, "holder": "bench", "ttl": 600, "now": None},
        )
        assert token_row is not None
        params = {"group": "raw", "shard": shard, "token": token_row[0], "now": None}
        claim = db.query("relay", "claim_batch", "outboxkit")
        mark = db.query("relay", "mark_published", "outboxkit")
        while True:
            found = await db.rows_async(
                conn,
                claim,
                {
                    "shard": shard,
                    "limit": BATCH,
                    "max_bytes": MAX_BYTES,
                    "skip_parked_keys": False,
                    "in_flight": [],
                    "now": None,
                },
            )
            ids = [row[0] for row in found]
            if not ids:
                return
            await db.execute_async(conn, mark, {**params, "ids": ids})


def raw_drain(server_url: str, topic: str, shards: int) -> float:
    return raw_drain_with_cpu(server_url, topic, shards)[0]


def raw_drain_with_cpu(server_url: str, topic: str, shards: int) -> tuple[float, dict[str, float]]:
    """Rows/s of the claim + mark statements alone, and CPU seconds per 100k rows of this
    process (their client) and of the servers: PostgreSQL's share is the floor any relay pays."""
    url = fresh_database(server_url, shards)
    try:
        fill(url, topic, ROWS)

        async def run() -> None:
            await asyncio.gather(*(raw_drain_shard(url, s) for s in range(shards)))

        before = {"client": own_seconds(), **service_seconds()}
        asyncio.run(run())
        after = {"client": own_seconds(), **service_seconds()}
        count, span = published_span(url)
        return count / span, per_100k(before, after, count)
    finally:
        drop_database(server_url, url)


def relay_process(
    url: str, bootstrap: str, mode: str, extra_env: dict[str, str]
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "OUTBOXKIT_DATABASE_URL": url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP": bootstrap,
        "OUTBOXKIT_RELAY_MODE": mode,
        "OUTBOXKIT_RELAY_BATCH_SIZE": str(BATCH),
        "OUTBOXKIT_RELAY_POLL_INTERVAL": "0.5",
        "OUTBOXKIT_RELAY_CHECKPOINT_TOPIC": f"bench.checkpoint.{uuid.uuid4().hex[:8]}",
        **extra_env,
    }
    # Its log goes to a file (named on exit if it died) instead of mixing with the figures.
    log = open(f"/tmp/relay-bench-{uuid.uuid4().hex[:8]}.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(  # the CLI's -v: INFO logs, for the per-shard stage figures
        [sys.executable, "-c", "from outboxkit.cli import main; main()", "-v", "relay", "run"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        # The working directory comes first on sys.path: an older checkout given in PYTHONPATH
        # (relay_ab.py's "before") must also be where the process starts, or this one is used.
        cwd=extra_env.get("PYTHONPATH", str(ROOT)).split(os.pathsep)[0],
    )
    log.close()
    LOGS[proc.pid] = log.name
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def print_stages(proc: subprocess.Popen[bytes]) -> None:
    """The relay's own account of a drain: transactions, claims per transaction, stage waits."""
    with open(LOGS[proc.pid], encoding="utf-8", errors="replace") as log:
        for line in log:
            if "publishing so far:" in line:
                print("    " + line.split("outboxkit.relay.shard_worker: ", 1)[-1].rstrip())


def service_seconds() -> dict[str, float]:
    return {name: tree_seconds(pid) for name, pid in SERVICE_PIDS.items()}


def cpu_line(cpu: dict[str, float]) -> str:
    """CPU seconds per 100k rows, by process (which one is the limit on a 2-core machine)."""
    if not cpu:
        return ""
    shown = ", ".join(f"{k} {v:.1f}" for k, v in cpu.items() if not k.startswith("_"))
    return f" (CPU s/100k rows: {shown})"


def relay_throughput(
    server_url: str,
    bootstrap: str,
    topic: str,
    shards: int,
    batch: int,
    processes: int,
    mode: str = "exactly_once",
    extra_env: dict[str, str] | None = None,
    rows: int = ROWS,
) -> tuple[float, dict[str, float]]:
    """``processes`` relay processes share the shards (each a separate Python interpreter).

    Returns rows/s and CPU seconds per 100k rows of the relay processes, PostgreSQL and Kafka
    while they drained the backlog (the relay's include its start-up, about a second), and of
    the whole machine (``machine``), and ``_cores``: how many cores were busy on average over
    the same window (at 2 cores, 2.0 is all there is), ``_steal``: how many the hypervisor took.
    """
    url = fresh_database(server_url, shards)
    try:
        fill(url, topic, rows)
        procs = []
        services_before, busy_before, window = service_seconds(), machine_busy(), time.monotonic()
        steal_before = machine_steal()
        for n in range(processes):
            owned = ",".join(str(s) for s in range(shards) if s % processes == n)
            env = {"OUTBOXKIT_RELAY_BATCH_SIZE": str(batch), "OUTBOXKIT_RELAY_SHARDS": owned}
            procs.append(relay_process(url, bootstrap, mode, {**env, **(extra_env or {})}))
        try:
            wait_drained(url, rows, procs=procs)
            relay_cpu = sum(process_seconds(p.pid) for p in procs)
            services_after, busy_after = service_seconds(), machine_busy()
            window, steal = time.monotonic() - window, machine_steal() - steal_before
        finally:
            for proc in procs:
                stop(proc)
        if STAGES:
            for proc in procs:
                print_stages(proc)
        count, span = published_span(url)
        per = 100_000 / count
        cpu = {"relay": relay_cpu * per, **per_100k(services_before, services_after, count)}
        cpu["machine"] = (busy_after - busy_before) * per  # everything, both cores
        cpu["_cores"] = (busy_after - busy_before) / window  # busy cores over the same window
        cpu["_steal"] = steal / window  # cores' worth the hypervisor gave to other guests
        return count / span, cpu
    finally:
        drop_database(server_url, url)


def bare_producer(bootstrap: str, topic: str) -> float:
    payload = ('{"n": 1, "pad": "' + "x" * 480 + '"}').encode()
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    started = time.perf_counter()
    for n in range(ROWS):
        while True:
            try:
                producer.produce(topic, payload, key=f"key-{n % KEYS}".encode())
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    return ROWS / (time.perf_counter() - started)


def warm_up(server_url: str, bootstrap: str) -> None:
    """One drain and one latency run, not counted: a freshly started broker JIT-compiles its
    transaction coordinator and read_committed fetch paths only after some thousands of
    transactions (measured: 8 s exactly-once latency runs one after another on a new broker,
    p50 / p99 45.8 / 133.2, 20.4 / 49.2, 18.3 / 45.5 ms, then 7.2-8.3 / 26-42 ms)."""
    if WARMUP_ROWS:
        print(
            f"warm-up, not counted: {WARMUP_ROWS} rows, then {WARMUP_SECONDS:.0f} s at 1,000"
            " events/s, exactly-once",
            flush=True,
        )
        topic = f"bench-warm-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 4)
        relay_throughput(server_url, bootstrap, topic, 1, BATCH, 1, rows=WARMUP_ROWS)
        if WARMUP_SECONDS > 0:
            latency(server_url, bootstrap, "exactly_once", seconds=WARMUP_SECONDS)


def latency(
    server_url: str,
    bootstrap: str,
    mode: str,
    extra_env: dict[str, str] | None = None,
    seconds: float = LATENCY_SECONDS,
) -> tuple[float, float, int]:
    topic = f"bench-latency-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 4)
    url = fresh_database(server_url, 1)
    committed: dict[str, float] = {}
    seen: dict[str, float] = {}
    # Wall-clock commit times and the records' CreateTime (set by the relay's producer when it
    # hands a record over): the latency split into the relay's pickup and Kafka's part.
    committed_at: dict[str, float] = {}
    produced_at: dict[str, float] = {}
    stopping = threading.Event()

    def consume() -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
            }
        )
        consumer.subscribe([topic])
        try:
            while not stopping.is_set():
                msg = consumer.poll(0.05)
                if msg is not None and msg.error() is None:
                    arrived = time.monotonic()
                    for name, value in msg.headers() or []:
                        if name == "event-id" and value is not None:
                            event_id = value.decode() if isinstance(value, bytes) else value
                            seen[event_id] = arrived
                            produced_at[event_id] = msg.timestamp()[1] / 1000
        finally:
            consumer.close()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    proc = relay_process(url, bootstrap, mode, extra_env or {})
    try:
        time.sleep(5)  # relay up, consumer assigned
        with psycopg.connect(url, autocommit=False) as conn:
            tick = time.monotonic()
            end = tick + seconds
            while tick < end:
                ids = [str(uuid.uuid4()) for _ in range(10)]
                conn.execute(
                    f"""
                    INSERT INTO outboxkit.outbox_message
                        (event_id, idempotency_key, content_digest, topic, message_key, payload,
                         shard)
                    SELECT e::uuid, 'lat-' || e, sha256(p), %(topic)s, 'key-' || g, p, 0
                    FROM unnest(%(ids)s::text[]) WITH ORDINALITY AS u(e, g),
                         LATERAL (SELECT {PAYLOAD_SQL} AS p) x
                    """,
                    {"topic": topic, "ids": ids},
                )
                # As the outbox writer does: a transactional hint for listening relays.
                conn.execute("SELECT pg_notify(%s, '0')", (notify_channel("outboxkit"),))
                conn.commit()
                done, wall = time.monotonic(), time.time()
                for event_id in ids:
                    committed[event_id] = done
                    committed_at[event_id] = wall
                tick += 0.01
                pause = tick - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
        deadline = time.monotonic() + 30
        while len(seen) < len(committed) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stopping.set()
        reader.join(10)
        stop(proc)
        if STAGES:
            print_stages(proc)
        drop_database(server_url, url)
    samples = sorted((seen[e] - c) * 1000 for e, c in committed.items() if e in seen)
    if not samples:
        raise RuntimeError("no event reached the consumer")
    p50, p99 = _percentiles(samples)
    if STAGES:
        pickup = {e: (produced_at[e] - committed_at[e]) * 1000 for e in seen}
        kafka = [(seen[e] - committed[e]) * 1000 - ms for e, ms in pickup.items()]
        (a50, a99), (b50, b99) = _percentiles(sorted(pickup.values())), _percentiles(sorted(kafka))
        print(
            "    latency split (ms, p50 / p99; CreateTime has 1 ms resolution): commit -> handed"
            f" to the producer {a50:.1f} / {a99:.1f}, then -> visible {b50:.1f} / {b99:.1f}",
            flush=True,
        )
    return p50, p99, len(committed) - len(samples)


def _percentiles(ordered: list[float]) -> tuple[float, float]:
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=60)


def watch_services(stack: DevStack) -> None:
    """Remember the self-started servers' pids (none when they are external)."""
    for name, server in (("postgres", stack.postgres), ("kafka", stack.kafka)):
        service = getattr(server, "_service", None)  # the dev stack's own process handle
        pid = getattr(service, "pid", None)
        if pid is not None:
            SERVICE_PIDS[name] = pid


GOALS = [  # (figure, goal, True: at least / False: at most)
    ("exactly-once / raw drain", 0.7, True),
    ("at-least-once / raw drain", 0.85, True),
    ("4 shards over 2 processes / 1 shard", 1.3, True),
    ("exactly_once latency p50 ms", 15, False),
    ("exactly_once latency p99 ms", 50, False),
    ("at_least_once latency p50 ms", 5, False),
    ("at_least_once latency p99 ms", 25, False),
]


def goal_figures(
    results: dict[str, float], latencies: dict[str, tuple[float, float]], default: str, alo: str
) -> dict[str, float]:
    """One round's acceptance figures: each ratio from runs of the same round."""
    figures: dict[str, float] = {}
    raw1, four = results.get("raw1"), results.get("exactly-once, 4 shards, defaults, 2 processes")
    if raw1 and default in results:
        figures["exactly-once / raw drain"] = results[default] / raw1
    if raw1 and alo in results:
        figures["at-least-once / raw drain"] = results[alo] / raw1
    if four and default in results:
        figures["4 shards over 2 processes / 1 shard"] = four / results[default]
    for mode, (p50, p99) in latencies.items():
        figures[f"{mode} latency p50 ms"], figures[f"{mode} latency p99 ms"] = p50, p99
    return figures


def print_goals(rounds: list[dict[str, float]]) -> None:
    """The acceptance figures next to their goals: with several rounds, the median of the
    rounds' own figures (every round's in brackets), how many rounds met each, and how many
    met every measured goal at once (load: this machine's, now). Figures print as the rounds'
    own lines do (ratios to 2 decimals, milliseconds to 1); pass or fail is decided unrounded."""
    print(f"goals (load average {os.getloadavg()[0]:.1f}):")
    for name, goal, at_least in GOALS:
        values = [r[name] for r in rounds if name in r]
        if not values:
            continue
        shown = "{:.1f}" if name.endswith(" ms") else "{:.2f}"
        met = sum(v >= goal if at_least else v <= goal for v in values)
        median = shown.format(statistics.median(values))
        line = f"  {name}: {median} ({'>=' if at_least else '<='} {goal})"
        if len(values) > 1:
            each = ", ".join(shown.format(v) for v in values)
            line += f"; median of {len(values)} rounds [{each}], met in {met}"
        print(line)
    if len(rounds) > 1 and any(rounds):
        every = sum(
            all(
                (r[name] >= goal if at_least else r[name] <= goal)
                for name, goal, at_least in GOALS
                if name in r
            )
            for r in rounds
        )
        print(f"  rounds that met every measured goal at once: {every} of {len(rounds)}")


def run_round(
    server_url: str,
    bootstrap: str,
    topic: str,
    runs: list[tuple[str, int, int, int, str, dict[str, str]]],
    pauses: PauseWatch,
    prefix: str,
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Every throughput run (the first of a shard count after a raw drain of that count), then
    the latency runs. Returns rows/s by run (and ``raw<shards>``) and p50 / p99 by mode."""
    results: dict[str, float] = {}
    for label, shards, batch, processes, mode, extra in runs:
        raw_key = f"raw{shards}"
        if raw_key not in results:
            results[raw_key], raw_cpu = raw_drain_with_cpu(server_url, topic, shards)
            print(
                f"{prefix}raw drain (claim + mark, batches of {BATCH}), {shards} shard(s):"
                f" {results[raw_key]:,.0f} rows/s{cpu_line(raw_cpu)}",
                flush=True,
            )
            pauses.warn()
        rate, cpu = relay_throughput(
            server_url, bootstrap, topic, shards, batch, processes, mode, extra
        )
        results[label] = rate
        print(
            f"{prefix}relay (mark), {label}: {rate:,.0f} rows/s"
            f" = {rate / results[raw_key]:.2f} x raw drain{cpu_line(cpu)};"
            f" machine busy {cpu.get('_cores', 0.0):.2f} of {os.cpu_count()} cores"
            f" (stolen by the host: {cpu.get('_steal', 0.0):.2f})",
            flush=True,
        )
        pauses.warn()
    latencies: dict[str, tuple[float, float]] = {}
    for mode in ("at_least_once", "exactly_once") if LATENCY_SECONDS > 0 else ():
        p50, p99, missing = latency(server_url, bootstrap, mode)
        latencies[mode] = (p50, p99)
        print(
            f"{prefix}latency {mode} at 1,000 events/s: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
            f" (commit -> read_committed consumer; {missing} not seen)",
            flush=True,
        )
        pauses.warn()
    return results, latencies


def main() -> None:
    started = time.monotonic()
    with DevStack(durable=True) as stack:
        server_url, bootstrap = stack.database_url, stack.kafka_bootstrap
        watch_services(stack)
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, 4)
        print(f"backlog {ROWS} rows, 500-byte JSON payloads, {KEYS} keys, batch {BATCH}")
        default = "exactly-once, 1 shard, defaults (claims of 500 growing to 2000), 1 process"
        alo = "at-least-once, 1 shard, defaults, 1 process"
        fixed = {"OUTBOXKIT_RELAY_MAX_BATCH_SIZE": str(BATCH)}
        runs = [  # (label, shards, relay batch, relay processes, mode, extra environment)
            (default, 1, BATCH, 1, "exactly_once", {}),
            ("exactly-once, 1 shard, fixed claims of 500, 1 process", 1, BATCH, 1,
             "exactly_once", fixed),
            (alo, 1, BATCH, 1, "at_least_once", {}),
            ("exactly-once, 4 shards, defaults, 2 processes", 4, BATCH, 2, "exactly_once", {}),
        ]  # fmt: skip
        runs = [run for n, run in enumerate(runs) if n not in SKIP_RUNS]
        warm_up(server_url, bootstrap)
        pauses = PauseWatch()
        rounds: list[dict[str, float]] = []
        first: dict[str, float] = {}
        for n in range(ROUNDS):
            prefix = f"round {n + 1}: " if ROUNDS > 1 else ""
            # Every other round runs the relays in reverse order: no run always comes first.
            ordered = runs if n % 2 == 0 else runs[::-1]
            results, latencies = run_round(server_url, bootstrap, topic, ordered, pauses, prefix)
            rounds.append(goal_figures(results, latencies, default, alo))
            first = first or results
            if ROUNDS > 1:
                print_goals(rounds[-1:])
        if BARE:
            bare = bare_producer(bootstrap, topic)
            print(f"bare confluent producer (idempotent, acks=all): {bare:,.0f} msg/s", flush=True)
            pauses.warn()
            for label, *_ in runs:
                which = " (round 1)" if ROUNDS > 1 else ""
                print(
                    f"  relay {label}{which}: {first[label] / bare:.2f} x bare producer", flush=True
                )
        print_goals(rounds)
        if pauses.total:
            print(f"!! the clock jumped by {pauses.total:.1f}s in all: see the warnings above")
    print(f"benchmark total {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
