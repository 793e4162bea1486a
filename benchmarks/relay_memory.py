"""Peak RSS of the relay with 1 MiB payloads and the default relay settings.

Run: ``python benchmarks/relay_memory.py`` (``BENCH_MEMORY_ROWS``, default 300 rows of 1 MiB;
``BENCH_MEMORY_SETTINGS`` a JSON object of extra ``OUTBOXKIT_RELAY_*`` variables to compare).
The relay runs as ``outboxkit relay run`` until the backlog is drained; its peak RSS is the
kernel's high-water mark (``VmHWM``). The topic and the producer allow 2 MiB records, as any
deployment sending 1 MiB payloads must (Kafka's default limit is 1 MB).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import psycopg
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

import relay as bench
from outboxkit.devstack import DevStack

ROWS = int(os.environ.get("BENCH_MEMORY_ROWS", "300"))
MIB = 1024 * 1024


def fill_large(url: str, topic: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO outboxkit.outbox_message
                (event_id, idempotency_key, content_digest, topic, message_key, payload, shard)
            SELECT e, 'mem-' || e, sha256(p), %(topic)s, 'key-' || (g %% 10), p, 0
            FROM (SELECT gen_random_uuid() AS e, g,
                         decode(repeat(md5(g::text), %(reps)s), 'hex') AS p
                  FROM generate_series(1, %(rows)s) AS g) s
            """,
            {"topic": topic, "rows": rows, "reps": MIB // 16},
        )


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def main() -> None:
    extra = json.loads(os.environ.get("BENCH_MEMORY_SETTINGS", "{}"))
    with DevStack(durable=True) as stack:
        server, bootstrap = stack.database_url, stack.kafka_bootstrap
        topic = f"bench-mem-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        new = NewTopic(topic, 4, 1, config={"max.message.bytes": str(2 * MIB)})
        for future in admin.create_topics([new]).values():
            future.result(timeout=60)
        url = bench.fresh_database(server, 1)
        try:
            fill_large(url, topic, ROWS)
            env = {
                "OUTBOXKIT_KAFKA_PROPERTIES": json.dumps({"message.max.bytes": 2 * MIB}),
                **{str(k): str(v) for k, v in extra.items()},
            }
            proc = bench.relay_process(url, bootstrap, "exactly_once", env)
            started = time.monotonic()
            try:
                bench.wait_drained(url, ROWS)
                peak = peak_rss_mib(proc.pid)
            finally:
                bench.stop(proc)
            took = time.monotonic() - started
        finally:
            bench.drop_database(server, url)
    print(
        f"{ROWS} rows of 1 MiB, exactly-once, settings {extra or 'default'}:"
        f" peak relay RSS {peak:.0f} MiB (drained in {took:.1f}s)"
    )


if __name__ == "__main__":
    main()
