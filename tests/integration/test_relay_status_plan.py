"""The relay's status sample walks only the pending rows, whatever the statistics say.

After a backlog drains, the statistics still count its rows as pending until the next ANALYZE.
Planned from them, the backlog count and the oldest pending row were each a scan of the whole
table: every second, in every relay process, while the relay needed the database most.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from outboxkit.db.queries import query

pytestmark = pytest.mark.integration

ROWS, LEFT = 20_000, 500

_FILL = """
INSERT INTO outboxkit.outbox_message
    (event_id, idempotency_key, content_digest, topic, message_key, payload, shard)
SELECT gen_random_uuid(), 'k' || g, '\\x00', 'orders', 'key-' || (g %% 100), '\\x7b7d', g %% 2
FROM generate_series(1, %(rows)s) AS g
"""


def _rows_read(node: dict[str, Any]) -> float:
    """Rows every scan of outbox_message produced or filtered away, over all its loops."""
    own = 0.0
    if node.get("Relation Name") == "outbox_message" and "Scan" in node["Node Type"]:
        per_loop = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        own = per_loop * node["Actual Loops"]
    return own + sum(_rows_read(child) for child in node.get("Plans", []))


@pytest.fixture
def drained_backlog(outboxkit_db_url: str) -> str:
    """Two shards, 20,000 rows analysed while pending, then all but 500 published."""
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE outboxkit.outbox_message SET (autovacuum_enabled = false)")
        conn.execute("UPDATE outboxkit.outbox_setting SET shard_count = 2")
        conn.execute(_FILL, {"rows": ROWS})
        conn.execute("ANALYZE outboxkit.outbox_message")
        conn.execute(
            "UPDATE outboxkit.outbox_message SET state = 'published', published_at = now()"
            " WHERE id > (SELECT min(id) FROM outboxkit.outbox_message) + %(left)s - 1",
            {"left": LEFT},
        )
    return outboxkit_db_url


def test_the_status_sample_reads_only_pending_rows_with_stale_statistics(
    drained_backlog: str,
) -> None:
    statement = query("relay", "status", "outboxkit")
    with psycopg.connect(drained_backlog) as conn:
        sql = b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement.psycopg
        ((plan,),) = conn.execute(sql, {"group": "default"}).fetchall()
        rows = conn.execute(statement.psycopg, {"group": "default"}).fetchall()
        conn.rollback()
    assert [(row[0], row[5]) for row in rows] == [(0, LEFT // 2), (1, LEFT // 2)]
    assert all(row[6] is not None and row[7] == 0 for row in rows)
    # The pending index still holds the published rows' entries (no vacuum ran): an index walk
    # passes them without reading them from the table; a scan of the table reads all 20,000.
    assert _rows_read(plan[0]["Plan"]) <= 2 * LEFT, plan
