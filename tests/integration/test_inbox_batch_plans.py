"""The inbox's batch statements look each event up by primary key, whatever the statistics say.

A consumer that starts on a large inbox table has rows the statistics do not know of until the
next ANALYZE. With ``m.consumer = :consumer`` as a constant, the planner then estimated that
consumer's rows at almost none and hashed all of them for every batch: a mark of 50 events read
all 20,000 rows of its consumer here (143 ms with 300,000), growing with the table.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from outboxkit.db.queries import query

pytestmark = pytest.mark.integration

KNOWN, NEW, BATCH = 20_000, 20_000, 50

_FILL = """
INSERT INTO outboxkit.inbox_message
    (consumer, event_id, content_digest, event_type, state, attempts, lease_owner, lease_token,
     lease_expires_at, topic, kafka_partition, kafka_offset, finished_at)
SELECT %(consumer)s, 'e' || g, '\\x00', 't', %(state)s, 1, 'o', g, now(), 'orders', 0, g,
       CASE WHEN %(state)s = 'succeeded' THEN now() END
FROM generate_series(1, %(rows)s) AS g
"""


def _rows_read(node: dict[str, Any]) -> float:
    """Rows every scan of inbox_message produced or filtered away, over all its loops."""
    own = 0.0
    if node.get("Relation Name") == "inbox_message" and "Scan" in node["Node Type"]:
        per_loop = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
        own = per_loop * node["Actual Loops"]
    return own + sum(_rows_read(child) for child in node.get("Plans", []))


@pytest.fixture
def stale_statistics(outboxkit_db_url: str) -> str:
    """One consumer analysed, then a new one's rows the statistics have not seen."""
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE outboxkit.inbox_message SET (autovacuum_enabled = false)")
        conn.execute(_FILL, {"consumer": "known", "state": "succeeded", "rows": KNOWN})
        conn.execute("ANALYZE outboxkit.inbox_message")
        conn.execute(_FILL, {"consumer": "new", "state": "processing", "rows": NEW})
    return outboxkit_db_url


@pytest.fixture
def no_statistics(outboxkit_db_url: str) -> str:
    """A new consumer's rows in a table no ANALYZE has seen (a fresh deployment, autovacuum
    late or off): the planner's default estimates. With the consumer as a one-row subquery
    joined first, a mark of 50 events compared every row of the consumer with every event
    (20,000 x 50 here, 275 ms; 511 ms with 40,000). A smaller table may be read whole by a
    hash join, which costs little at that size."""
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE outboxkit.inbox_message SET (autovacuum_enabled = false)")
        conn.execute(_FILL, {"consumer": "new", "state": "processing", "rows": NEW})
    return outboxkit_db_url


@pytest.fixture(params=["stale_statistics", "no_statistics"])
def statistics(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(request.param)
    return url


@pytest.mark.parametrize("name", ["mark_succeeded_batch", "release_batch"])
def test_a_batch_statement_reads_only_its_own_rows_whatever_the_statistics(
    statistics: str, name: str
) -> None:
    statement = query("inbox", name, "outboxkit")
    params: dict[str, Any] = {
        "consumer": "new",
        "event_ids": [f"e{n}" for n in range(1000, 1000 + BATCH)],
        "tokens": list(range(1000, 1000 + BATCH)),
        "now": None,
        "idle_ms": 10_000,
    }
    with psycopg.connect(statistics) as conn:
        sql = b"EXPLAIN (ANALYZE, FORMAT JSON) " + statement.psycopg
        ((plan,),) = conn.execute(sql, {k: params[k] for k in statement.parameters}).fetchall()
        conn.rollback()
    top = plan[0]["Plan"]
    # The statement's rows come from its outer plan (the mark's quiet-bound CTE is an InitPlan).
    outer = [p for p in top.get("Plans", []) if p.get("Parent Relationship") == "Outer"]
    changed = outer[0]["Actual Rows"] if top["Node Type"] == "ModifyTable" and outer else None
    assert changed == BATCH
    assert _rows_read(top) <= 2 * BATCH, plan
