"""Housekeeping's sweep reads the rows it deletes, not the published rows kept for retention.

Discarded rows had no index: every sweep of every shard (one each ``housekeeping_interval``)
was a sequential scan of the whole outbox table, published rows kept for their retention window
included (millions of rows), and once psycopg had prepared the statement, a walk of the primary
key through all of them. The partial index of migration 0005 holds the discarded rows alone.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from psycopg import sql

from outboxkit.db.queries import _BIND_RE, query

pytestmark = pytest.mark.integration

PUBLISHED, SHARDS, BATCH = 200_000, 4, 100
OLD, YOUNG = 5, 3  # per shard and state: past the one-day window, inside it
DAY = 86400
INDEX = {"discarded": "outbox_message_discarded_idx", "parked": "outbox_message_parked_idx"}

_ROWS = """
INSERT INTO outboxkit.outbox_message (event_id, idempotency_key, content_digest, topic,
    message_key, payload, shard, state, published_at, created_at)
SELECT gen_random_uuid(), 'pub-' || g, '\\x00', 'orders', 'key-' || (g %% 1000), '\\x7b7d',
       g %% %(shards)s, %(state)s, CASE WHEN %(state)s = 'published' THEN now() END,
       now() - interval '1 hour'
FROM generate_series(1, %(rows)s) AS g
"""
_FINAL = """
INSERT INTO outboxkit.outbox_message (event_id, idempotency_key, content_digest, topic,
    message_key, payload, shard, state, parked_reason, parked_at)
SELECT gen_random_uuid(), %(state)s || '-' || %(shard)s || '-' || %(age)s || '-' || g, '\\x00',
       'orders', %(state)s || '-' || g, '\\x7b7d', %(shard)s, %(state)s, 'test',
       now() - CAST(%(age)s AS interval)
FROM generate_series(1, %(rows)s) AS g
"""
_STRAYS = (-1, SHARDS + 5)  # shards of no holder: shard 0's holder sweeps them too


@pytest.fixture
def big_outbox(outboxkit_db_url: str) -> str:
    """200,000 published rows over four shards; per shard and final state, five rows past the
    window and three inside it; one old row of each state in each of two shards of no holder.
    Statistics are fresh."""
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE outboxkit.outbox_message SET (autovacuum_enabled = false)")
        conn.execute("UPDATE outboxkit.outbox_setting SET shard_count = %s", (SHARDS,))
        conn.execute(_ROWS, {"rows": PUBLISHED, "shards": SHARDS, "state": "published"})
        for state in INDEX:
            for shard in range(SHARDS):
                for age, rows in (("2 days", OLD), ("1 hour", YOUNG)):
                    conn.execute(_FINAL, {"state": state, "shard": shard, "age": age, "rows": rows})
            for shard in _STRAYS:
                conn.execute(_FINAL, {"state": state, "shard": shard, "age": "2 days", "rows": 1})
        conn.execute("VACUUM ANALYZE outboxkit.outbox_message")
    return outboxkit_db_url


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node reading outbox_message or one of its indexes, init plans included."""
    reads = node.get("Relation Name") == "outbox_message" or "Index Name" in node
    own = [node] if reads and node["Node Type"].endswith("Scan") else []
    return own + [n for child in node.get("Plans", []) for n in _nodes(child)]


def _prepared(state: str) -> tuple[bytes, list[str]]:
    """The state's statement as a PREPARE with ``$n`` parameters (as psycopg prepares a
    statement it has run five times on a connection) and the parameters' order."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in order:
            order.append(match[1])
        return f"${order.index(match[1]) + 1}"

    text = _BIND_RE.sub(number, query("relay", f"housekeeping_delete_{state}", "outboxkit").text)
    return f"PREPARE sweep AS {text}".encode(), order


def _sweep(url: str, state: str, shard: int, mode: str) -> tuple[dict[str, Any], int]:
    """The executed plan of one batch of ``shard``'s sweep of ``state`` rows, by the lease
    holder, and the rows of that state left (the batch is rolled back). ``prepared``: the
    statement has run five times already, after which PostgreSQL may keep one generic plan;
    ``generic``: the role forces generic plans (``plan_cache_mode``), as an operator may."""
    prepare, order = _prepared(state)
    acquire = query("relay", "lease_acquire", "outboxkit")
    lease = {"group": "default", "shard": shard, "holder": "me", "ttl": 60, "now": None}
    with psycopg.connect(url) as conn:
        ((token, _previous),) = conn.execute(acquire.psycopg, lease).fetchall()
        cache_mode = {"custom": "force_custom_plan", "generic": "force_generic_plan"}.get(
            mode, "auto"
        )
        conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.SQL(cache_mode)))
        conn.execute(prepare)

        def execute(token: int) -> sql.Composed:
            values = {**lease, "token": token, "keep_seconds": DAY}
            values["limit"] = BATCH
            args = sql.SQL(", ").join(sql.Literal(values[p]) for p in order)
            return sql.SQL("EXECUTE sweep ({})").format(args)

        if mode == "prepared":
            for _ in range(5):  # not the lease's token: these delete nothing
                conn.execute(execute(-1))
        explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) {}").format(execute(token))
        ((plan,),) = conn.execute(explain).fetchall()
        left = conn.execute(
            "SELECT count(*) FROM outboxkit.outbox_message WHERE state = %s", (state,)
        ).fetchone()
        conn.rollback()
    assert left is not None
    return plan[0]["Plan"], int(left[0])


@pytest.mark.parametrize("mode", ["custom", "prepared", "generic"])
@pytest.mark.parametrize("shard", [1, 0])
@pytest.mark.parametrize("state", sorted(INDEX))
def test_a_sweep_reads_only_rows_of_its_state(
    big_outbox: str, state: str, shard: int, mode: str
) -> None:
    plan, left = _sweep(big_outbox, state, shard, mode)
    removed = OLD + (len(_STRAYS) if shard == 0 else 0)
    assert left == SHARDS * (OLD + YOUNG) + len(_STRAYS) - removed
    nodes = _nodes(plan)
    table = [n for n in nodes if n.get("Relation Name") == "outbox_message"]
    assert "Seq Scan" not in {n["Node Type"] for n in table}, plan
    assert INDEX[state] in {n.get("Index Name") for n in nodes}, plan
    # Only rows of the state, each seen at most twice (found, then deleted): no published row.
    read = sum(
        (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"] for n in table
    )
    assert read <= 2 * (SHARDS * (OLD + YOUNG) + len(_STRAYS)), plan


def _pages(conn: psycopg.Connection[Any], index: str) -> int:
    row = conn.execute(
        "SELECT pg_relation_size(%s) / current_setting('block_size')::int", (f"outboxkit.{index}",)
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_writing_and_publishing_rows_adds_nothing_to_the_discarded_index(
    outboxkit_db_url: str,
) -> None:
    """The index costs the write path nothing: a row enters it only when it is discarded."""
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        empty = _pages(conn, INDEX["discarded"])
        conn.execute(_ROWS, {"rows": 20_000, "shards": SHARDS, "state": "pending"})
        pending = _pages(conn, "outbox_message_pending_idx")
        conn.execute(
            "UPDATE outboxkit.outbox_message SET state = 'published', published_at = now()"
        )
        assert _pages(conn, INDEX["discarded"]) == empty == 1  # the metapage alone
        assert pending > 1  # the same rows filled the pending index
        conn.execute(
            "UPDATE outboxkit.outbox_message SET state = 'discarded', parked_at = now(),"
            " parked_reason = 'test' WHERE id % 2 = 0"
        )
        assert _pages(conn, INDEX["discarded"]) > 1
