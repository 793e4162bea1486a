"""The relay's backlog count walks only the pending rows, whatever the statistics say.

After a backlog drains, the statistics still count its rows as pending until the next ANALYZE.
Planned from them, the count and the oldest pending row were each a scan of the whole table
(later a bitmap scan of it, with four shards): every second, in every relay process, while the
relay needed the database most.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from outboxkit.db.queries import query

pytestmark = pytest.mark.integration

ROWS, LEFT, SHARDS = 40_000, 800, 4

_FILL = """
INSERT INTO outboxkit.outbox_message
    (event_id, idempotency_key, content_digest, topic, message_key, payload, shard)
SELECT gen_random_uuid(), 'k' || g, '\\x00', 'orders', 'key-' || (g %% 100), '\\x7b7d',
       g %% %(shards)s
FROM generate_series(1, %(rows)s) AS g
"""


def _scans(node: dict[str, Any]) -> list[dict[str, Any]]:
    """Every scan of outbox_message in the plan."""
    own = [node] if node.get("Relation Name") == "outbox_message" else []
    return own + [scan for child in node.get("Plans", []) for scan in _scans(child)]


@pytest.fixture
def drained_backlog(outboxkit_db_url: str) -> str:
    """Four shards, 40,000 rows analysed while pending, then all but 800 published."""
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE outboxkit.outbox_message SET (autovacuum_enabled = false)")
        conn.execute("UPDATE outboxkit.outbox_setting SET shard_count = %s", (SHARDS,))
        conn.execute(_FILL, {"rows": ROWS, "shards": SHARDS})
        conn.execute("ANALYZE outboxkit.outbox_message")
        conn.execute(
            "UPDATE outboxkit.outbox_message SET state = 'published', published_at = now()"
            " WHERE id > (SELECT min(id) FROM outboxkit.outbox_message) + %(left)s - 1",
            {"left": LEFT},
        )
    return outboxkit_db_url


def test_the_backlog_count_walks_the_pending_index_with_stale_statistics(
    drained_backlog: str,
) -> None:
    statement = query("relay", "status", "outboxkit")
    walk_only = query("relay", "pending_walk_only", "outboxkit")
    with psycopg.connect(drained_backlog) as conn:
        conn.execute(walk_only.psycopg)
        sql = b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement.psycopg
        params = {"group": "default", "holder": None, "only": None, "now": None}
        ((plan,),) = conn.execute(sql, params).fetchall()
        rows = conn.execute(statement.psycopg, params).fetchall()
        conn.rollback()
    assert [(row[0], row[5]) for row in rows] == [(s, LEFT // SHARDS) for s in range(SHARDS)]
    assert all(row[6] is not None and row[7] == 0 for row in rows)
    scans = _scans(plan[0]["Plan"])
    pending = [s for s in scans if s.get("Index Name") == "outbox_message_pending_idx"]
    assert pending, plan
    assert all(s["Node Type"] == "Index Scan" for s in pending), plan
    # Anything else that reads the table (a sequential or bitmap scan) reads every row of it.
    others = [
        s
        for s in scans
        if s.get("Index Name") not in ("outbox_message_pending_idx", "outbox_message_parked_idx")
    ]
    assert not others, plan
    assert sum(s["Actual Rows"] * s["Actual Loops"] for s in pending) == LEFT
    # Not compiled: the disabled seq scan's cost (of the one-row outbox_setting) put the
    # estimate past jit_above_cost, and JIT took about 200 ms of a 5 ms statement.
    assert "JIT" not in plan[0], plan[0]["JIT"]


def _walked(drained_backlog: str, only: list[int] | None) -> tuple[list[Any], list[Any]]:
    """Status rows and pending-index scans of relay process "me", which holds shard 0 while
    "other" holds shard 1 (2 and 3: nobody's)."""
    statement = query("relay", "status", "outboxkit")
    walk_only = query("relay", "pending_walk_only", "outboxkit")
    acquire = query("relay", "lease_acquire", "outboxkit")
    with psycopg.connect(drained_backlog) as conn:
        for shard, holder in ((0, "me"), (1, "other")):
            conn.execute(
                acquire.psycopg,
                {"group": "default", "shard": shard, "holder": holder, "ttl": 60, "now": None},
            )
        conn.execute(walk_only.psycopg)
        sql = b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement.psycopg
        params = {"group": "default", "holder": "me", "only": only, "now": None}
        ((plan,),) = conn.execute(sql, params).fetchall()
        rows = conn.execute(statement.psycopg, params).fetchall()
        conn.rollback()
    pending = [
        s for s in _scans(plan[0]["Plan"]) if s.get("Index Name") == "outbox_message_pending_idx"
    ]
    return rows, pending


def test_a_relay_process_walks_no_backlog_another_process_holds(drained_backlog: str) -> None:
    rows, pending = _walked(drained_backlog, None)
    per_shard = LEFT // SHARDS
    assert [(row[0], row[5], row[8], row[9]) for row in rows] == [
        (0, per_shard, True, True),
        (1, None, False, False),
        (2, per_shard, True, True),
        (3, per_shard, True, True),
    ]
    assert rows[1][6] is None  # no oldest age either
    # Not walked at all (a one-time filter), not walked and filtered out row by row.
    assert [(s["Actual Loops"], s.get("Rows Removed by Filter", 0)) for s in pending] == [
        (SHARDS - 1, 0)
    ], pending
    assert sum(s["Actual Rows"] * s["Actual Loops"] for s in pending) == LEFT - per_shard


def test_a_count_of_one_shard_walks_that_shard_alone(drained_backlog: str) -> None:
    rows, pending = _walked(drained_backlog, [3])
    assert [(row[0], row[5], row[8], row[9]) for row in rows] == [
        (0, None, True, False),
        (1, None, False, False),
        (2, None, True, False),
        (3, LEFT // SHARDS, True, True),
    ]
    assert [(s["Actual Loops"], s["Actual Rows"]) for s in pending] == [(1, LEFT // SHARDS)]
