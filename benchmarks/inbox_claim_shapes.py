"""The batch dedup statements alone: today's claim + mark against an optimistic shape (experiment).

Run: ``python benchmarks/inbox_claim_shapes.py`` (its own durable PostgreSQL unless
``OUTBOXKIT_DATABASE_URL`` names a running one; ``BENCH_ROUNDS`` default 10, ``BENCH_BATCHES``
per round default 60, ``BENCH_HISTORY`` finished rows of another consumer default 100000).

Per batch of 50 new events, on one connection, raw psycopg, no handler work:

* ``current``: outboxkit's own ``claim_batch`` (one ``processing`` row per event, committed
  without waiting for its flush) and, in the handler's transaction, ``mark_succeeded_batch``
  (each row to ``succeeded``, conditional on its token), then a durable COMMIT;
* ``optimistic`` (not built): one marker row per batch and partition instead of a row per event
  (committed without waiting for its flush, with a probe of the events' existing rows in the
  same statement), then in the handler's transaction one plain INSERT of the events' rows as
  ``succeeded`` (a row that already exists aborts the batch) and the marker's token-conditional
  DELETE, then a durable COMMIT;
* ``plain`` (not built): ``current`` with the claim a plain ``INSERT`` (no ``ON CONFLICT``: no
  speculative insertion; the upsert would stay for a batch holding a known event);
* ``one_token`` (not built): ``plain`` with one lease token per batch (one ``nextval``).
* ``hot`` (not built): ``current`` on a copy of the schema (``outboxkit_hot``) whose purge index
  is ``(consumer, created_at)`` instead of the partial ``(consumer, finished_at) WHERE state <>
  'processing'``, and whose table leaves room on each page (``fillfactor``, ``BENCH_FILLFACTOR``
  default 50: a row's new version goes on its own page only if there is room): the mark then
  changes no indexed column, so PostgreSQL may make it a HOT update (no new index entries).

``BENCH_VARIANTS`` (comma-separated) runs a subset.

Prints wall microseconds per event (median of each round's batches) and the backend's CPU per
event (from /proc), variants alternating round by round. Benchmark code, not part of outboxkit.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
import uuid
from typing import Any

import psycopg
from consumer import HISTORY_SQL, scratch_database

from outboxkit.db.migrator import upgrade
from outboxkit.db.queries import query
from outboxkit.devstack import DevStack
from outboxkit.inbox.store import QUIET_AFTER_MARK_SECONDS

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "10"))
BATCHES = int(os.environ.get("BENCH_BATCHES", "60"))
HISTORY = int(os.environ.get("BENCH_HISTORY", "100000"))
BATCH = 50
SCHEMA = "outboxkit"

CLAIM = query("inbox", "claim_batch", SCHEMA).psycopg_binary
MARK = query("inbox", "mark_succeeded_batch", SCHEMA).psycopg_binary
HOT_SCHEMA = "outboxkit_hot"
FILLFACTOR = int(os.environ.get("BENCH_FILLFACTOR", "50"))
HOT_CLAIM = query("inbox", "claim_batch", HOT_SCHEMA).psycopg_binary
HOT_MARK = query("inbox", "mark_succeeded_batch", HOT_SCHEMA).psycopg_binary
HOT_TABLE = f"""
DROP INDEX {HOT_SCHEMA}.inbox_message_consumer_finished_idx;
CREATE INDEX ON {HOT_SCHEMA}.inbox_message (consumer, created_at);
ALTER TABLE {HOT_SCHEMA}.inbox_message SET (fillfactor = {FILLFACTOR})
"""
HOT_UPDATES = f"""
SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
WHERE schemaname = '{HOT_SCHEMA}' AND relname = 'inbox_message'
"""

MARKER_TABLE = """
CREATE TABLE outboxkit.bench_inbox_batch (
    consumer text, topic text, kafka_partition integer, first_offset bigint, last_offset bigint,
    lease_token bigint, attempts integer, lease_expires_at timestamptz,
    PRIMARY KEY (consumer, topic, kafka_partition, first_offset))
"""
OPTIMISTIC_CLAIM = """
WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS setting),
marker AS (
    INSERT INTO outboxkit.bench_inbox_batch AS b
        (consumer, topic, kafka_partition, first_offset, last_offset, lease_token, attempts,
         lease_expires_at)
    SELECT %(consumer)s, 'bench', 0, %(first)s, %(last)s,
           nextval('outboxkit.inbox_lease_token_seq'), 1, now() + make_interval(secs => 30)
    FROM relaxed
    ON CONFLICT (consumer, topic, kafka_partition, first_offset)
    DO UPDATE SET attempts = b.attempts + 1, lease_token = EXCLUDED.lease_token
    RETURNING b.lease_token)
SELECT (SELECT lease_token FROM marker),
       (SELECT array_agg(m.event_id) FROM outboxkit.inbox_message AS m
        JOIN unnest(CAST(%(event_ids)b AS text[]),
                    array_fill(CAST(%(consumer)s AS text),
                               ARRAY[cardinality(CAST(%(event_ids)b AS text[]))]))
             AS g(event_id, consumer)
          ON m.consumer = g.consumer AND m.event_id = g.event_id)
"""
OPTIMISTIC_INSERT = """
INSERT INTO outboxkit.inbox_message
    (consumer, event_id, idempotency_key, content_digest, event_type, state, attempts,
     lease_owner, lease_token, topic, kafka_partition, kafka_offset, finished_at)
SELECT %(consumer)s, g.event_id, g.event_id, g.content_digest, 'charged', 'succeeded', 1, 'o',
       %(token)s, 'bench', 0, g.kafka_offset, now()
FROM unnest(CAST(%(event_ids)b AS text[]), CAST(%(content_digests)b AS bytea[]),
            CAST(%(kafka_offsets)b AS bigint[])) AS g(event_id, content_digest, kafka_offset)
"""
OPTIMISTIC_DONE = """
DELETE FROM outboxkit.bench_inbox_batch
WHERE consumer = %(consumer)s AND topic = 'bench' AND kafka_partition = 0
  AND first_offset = %(first)s AND lease_token = %(token)s
"""


def backend_cpu(conn: psycopg.Connection[Any]) -> float:
    with open(f"/proc/{conn.info.backend_pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batch_parameters(consumer: str, first: int) -> dict[str, Any]:
    ids = [str(uuid.uuid4()) for _ in range(BATCH)]
    return {
        "consumer": consumer,
        "event_ids": ids,
        "idempotency_keys": ids,
        "content_digests": [hashlib.sha256(i.encode()).digest() for i in ids],
        "event_types": ["charged"] * BATCH,
        "topics": ["bench"] * BATCH,
        "kafka_partitions": [0] * BATCH,
        "kafka_offsets": list(range(first, first + BATCH)),
        "owner": "bench",
        "now": None,
        "lease_seconds": 30.0,
        "idle_ms": int(QUIET_AFTER_MARK_SECONDS * 1000),  # the mark's bound, as the store passes
        "first": first,
        "last": first + BATCH - 1,
    }


def _with_claim(claim: bytes, mark: bytes = MARK) -> Any:
    def run(conn: psycopg.Connection[Any], params: dict[str, Any]) -> None:
        with conn.transaction():
            claimed = conn.execute(claim, params).fetchall()
        params["tokens"] = [row[1] for row in claimed]
        with conn.transaction():
            if len(conn.execute(mark, params).fetchall()) != BATCH:
                raise RuntimeError("mark missed rows")

    return run


current = _with_claim(CLAIM)


def optimistic(conn: psycopg.Connection[Any], params: dict[str, Any]) -> None:
    with conn.transaction():
        row = conn.execute(OPTIMISTIC_CLAIM.encode(), params).fetchone()
    if row is None or row[1] is not None:
        raise RuntimeError("fresh events expected")
    params["token"] = row[0]
    with conn.transaction():
        conn.execute(OPTIMISTIC_INSERT.encode(), params)
        if conn.execute(OPTIMISTIC_DONE.encode(), params).rowcount != 1:
            raise RuntimeError("marker lost")


def _plain_claim() -> bytes:
    """The shipped claim without its ``ON CONFLICT`` clause."""
    text = CLAIM.decode()
    return (text[: text.index("ON CONFLICT")] + text[text.index("RETURNING") :]).encode()


PLAIN_CLAIM = _plain_claim()
ONE_TOKEN_CLAIM = PLAIN_CLAIM.replace(
    b"nextval('outboxkit.inbox_lease_token_seq')",
    b"(SELECT nextval('outboxkit.inbox_lease_token_seq'))",
)


ALL_VARIANTS = {
    "current": current,
    "optimistic": optimistic,
    "plain": _with_claim(PLAIN_CLAIM),
    "one_token": _with_claim(ONE_TOKEN_CLAIM),
    "hot": _with_claim(HOT_CLAIM, HOT_MARK),
}
CHOSEN = os.environ.get("BENCH_VARIANTS", ",".join(ALL_VARIANTS)).split(",")
VARIANTS = {name: ALL_VARIANTS[name] for name in CHOSEN}


def main() -> None:
    # The stack uses the servers OUTBOXKIT_DATABASE_URL / OUTBOXKIT_KAFKA_BOOTSTRAP name, if any.
    with DevStack(durable=True) as stack, scratch_database(stack.database_url) as url:
        upgrade(url)
        if "hot" in VARIANTS:
            upgrade(url, HOT_SCHEMA)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(MARKER_TABLE)
            conn.execute(HISTORY_SQL, {"rows": HISTORY})
            conn.execute("VACUUM ANALYZE outboxkit.inbox_message")
            if "hot" in VARIANTS:
                conn.execute(HOT_TABLE)
                history = HISTORY_SQL.replace("outboxkit.", f"{HOT_SCHEMA}.")
                conn.execute(history, {"rows": HISTORY})  # type: ignore[arg-type]
                conn.execute(f"VACUUM ANALYZE {HOT_SCHEMA}.inbox_message")  # type: ignore[arg-type]
            wall: dict[str, list[float]] = {name: [] for name in VARIANTS}
            cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
            offset = 0
            for round_ in range(ROUNDS):
                order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
                for name in order:
                    run, times, before = VARIANTS[name], [], backend_cpu(conn)
                    for _ in range(BATCHES):
                        params = batch_parameters(name, offset)
                        offset += BATCH
                        started = time.perf_counter()
                        run(conn, params)
                        times.append(time.perf_counter() - started)
                    cpu[name].append((backend_cpu(conn) - before) / (BATCHES * BATCH) * 1e6)
                    wall[name].append(statistics.median(times) / BATCH * 1e6)
        print(f"{ROUNDS} rounds of {BATCHES} batches of {BATCH}, {HISTORY} history rows")
        for name in VARIANTS:
            rounds = " / ".join(f"{w:.0f}" for w in wall[name])
            print(
                f"{name:>10}: wall {statistics.median(wall[name]):.1f} us/event "
                f"(rounds {rounds}), backend CPU {statistics.median(cpu[name]):.1f} us/event"
            )
        if "hot" in VARIANTS:
            with psycopg.connect(url) as conn:
                row = conn.execute(HOT_UPDATES).fetchone()
            print(f"       hot: {row[1]} of {row[0]} updates of its table were HOT")  # type: ignore[index]


if __name__ == "__main__":
    main()
