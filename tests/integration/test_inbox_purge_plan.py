"""One consumer's purge reads only that consumer's old rows, in a custom and in a generic plan.

The purge indexes used to be ordered by age alone: a consumer purging with a one-day window
walked every row another consumer (with a longer window) still kept, and filtered it out, in
every batch of the loop's retention timer, which the consumer loop waits for. psycopg prepares a
statement it has run five times, and PostgreSQL may then plan it once for any parameters (a
generic plan): there a "consumer IS NULL OR" filter cannot seek, and a join with the batch
cannot tell the LIMIT and hashed it against the whole table.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from psycopg import sql
from sqlalchemy import create_engine

from outboxkit.db import query, sqlalchemy_url
from outboxkit.db.queries import _BIND_RE
from outboxkit.inbox.retention import purge_finished

pytestmark = pytest.mark.integration

OTHERS, OLD, YOUNG, BATCH = 20_000, 300, 5_000, 100
DAY = 86400
PLAN_MODES = ["force_custom_plan", "force_generic_plan"]
_PURGES = {  # statement -> (its table, the index it must walk)
    "delete_finished_batch": ("inbox_message", "inbox_message_consumer_finished_idx"),
    "delete_rejections_batch": ("inbox_rejection", "inbox_rejection_consumer_created_idx"),
}

_FILL = (
    """
    INSERT INTO outboxkit.inbox_message (consumer, event_id, state, finished_at)
    SELECT %(consumer)s, %(prefix)s || g, 'succeeded',
           now() - CAST(%(age)s AS interval) - g * interval '1 s'
    FROM generate_series(1, %(rows)s) AS g
    """,
    """
    INSERT INTO outboxkit.inbox_rejection
        (consumer, reason, topic, kafka_partition, kafka_offset, created_at)
    SELECT %(consumer)s, 'reused', %(prefix)s, 0, g,
           now() - CAST(%(age)s AS interval) - g * interval '1 s'
    FROM generate_series(1, %(rows)s) AS g
    """,
)


@pytest.fixture
def two_windows(outboxkit_db_url: str) -> str:
    """Consumer audit keeps 20,000 rows of each kind 7 days old (its window is longer); billing
    has 300 past its one-day window and 5,000 inside it. Statistics are fresh."""
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        for consumer, prefix, rows, age in (
            ("audit", "a-", OTHERS, "7 days"),
            ("billing", "old-", OLD, "2 days"),
            ("billing", "young-", YOUNG, "1 hour"),
        ):
            for fill in _FILL:
                conn.execute(
                    fill, {"consumer": consumer, "prefix": prefix, "rows": rows, "age": age}
                )
        conn.execute("VACUUM ANALYZE outboxkit.inbox_message")
        conn.execute("VACUUM ANALYZE outboxkit.inbox_rejection")
    return outboxkit_db_url


def _scans(node: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """Every scan of ``table`` in the plan, init plans and subplans included."""
    mine = node.get("Relation Name") == table and node["Node Type"].endswith("Scan")
    own = [node] if mine else []
    return own + [scan for child in node.get("Plans", []) for scan in _scans(child, table)]


def _prepared(name: str) -> tuple[bytes, list[str]]:
    """The statement as a PREPARE with ``$n`` parameters (their types inferred, as for the
    statements psycopg prepares) and the parameters' order."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in order:
            order.append(match[1])
        return f"${order.index(match[1]) + 1}"

    text = _BIND_RE.sub(number, query("inbox", name, "outboxkit").text)
    return f"PREPARE purge AS {text}".encode(), order


def _explain(url: str, name: str, mode: str, batch: int) -> tuple[dict[str, Any], int, int]:
    """The executed plan of one batch of billing's purge, then billing's old rows and audit's
    rows left in that table (the batch is rolled back)."""
    table = _PURGES[name][0]
    column = "finished_at" if table == "inbox_message" else "created_at"
    prepare, order = _prepared(name)
    values = {"consumer": "billing", "window_seconds": DAY, "batch_size": batch, "now": None}
    with psycopg.connect(url) as conn:
        conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.SQL(mode)))
        conn.execute(prepare)
        execute = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE purge ({})").format(
            sql.SQL(", ").join(sql.Literal(values[p]) for p in order)
        )
        ((plan,),) = conn.execute(execute).fetchall()
        counts = sql.SQL(
            "SELECT count(*) FILTER (WHERE consumer = 'billing' AND {c} < now() - interval '1d'),"
            " count(*) FILTER (WHERE consumer = 'audit') FROM outboxkit.{t}"
        ).format(c=sql.Identifier(column), t=sql.Identifier(table))
        ((old_left, others_left),) = conn.execute(counts).fetchall()
        conn.rollback()
    return plan[0]["Plan"], old_left, others_left


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("name", sorted(_PURGES))
@pytest.mark.parametrize("batch", [BATCH, 5 * BATCH])  # a full batch, the last short one
def test_one_consumers_purge_reads_none_of_another_consumers_rows(
    two_windows: str, name: str, mode: str, batch: int
) -> None:
    table, index = _PURGES[name]
    plan, old_left, others_left = _explain(two_windows, name, mode, batch)
    assert (old_left, others_left) == (max(OLD - batch, 0), OTHERS)
    scans = _scans(plan, table)
    # Only seeks: a sequential or bitmap scan reads rows of every consumer.
    assert {s["Node Type"] for s in scans} <= {"Index Scan", "Index Only Scan"}, plan
    [walk] = [s for s in scans if s.get("Index Name") == index]
    assert "consumer = " in walk["Index Cond"], walk
    assert walk["Actual Rows"] * walk["Actual Loops"] == min(batch, OLD)
    # Nothing read and thrown away: not audit's rows, nor billing's young ones.
    assert sum(s.get("Rows Removed by Filter", 0) for s in scans) == 0, plan
    assert sum(s["Actual Rows"] * s["Actual Loops"] for s in scans) == 2 * min(batch, OLD), plan


def test_a_purge_of_every_consumer_walks_each_one_that_has_old_rows(two_windows: str) -> None:
    """One listing, then each consumer's own range scans; max_batches counts across them."""
    with psycopg.connect(two_windows, autocommit=True) as conn:
        conn.execute(  # only young rows: no batch at all; old rejections only: purged
            "INSERT INTO outboxkit.inbox_message (consumer, event_id, state, finished_at)"
            " VALUES ('fresh', 'f-1', 'succeeded', now()), ('shipping', 's-1', 'processing', NULL)"
        )
        conn.execute(
            "INSERT INTO outboxkit.inbox_rejection"
            " (consumer, reason, topic, kafka_partition, kafka_offset, created_at)"
            " VALUES ('shipping', 'old', 't', 0, 1, now() - interval '3 days')"
        )
        listing = query("inbox", "purge_consumers", "outboxkit")
        found = conn.execute(listing.psycopg, {"window_seconds": DAY, "now": None}).fetchall()
    assert found == [("audit",), ("billing",), ("shipping",)]

    engine = create_engine(sqlalchemy_url(two_windows))
    try:
        capped = purge_finished(
            engine, consumer=None, window_seconds=DAY, batch_size=10_000, max_batches=2
        )
        # audit's two full batches use the whole budget of each table
        assert (capped.messages, capped.rejections, capped.batches) == (20_000, 20_000, 4)
        rest = purge_finished(engine, consumer=None, window_seconds=DAY, batch_size=10_000)
    finally:
        engine.dispose()
    # billing (one short batch), shipping: no dedup row to purge, one rejection
    assert (rest.messages, rest.rejections) == (OLD, OLD + 1)
    with psycopg.connect(two_windows) as conn:
        left = conn.execute(
            "SELECT consumer, count(*) FROM outboxkit.inbox_message GROUP BY 1 ORDER BY 1"
        ).fetchall()
        rejections = conn.execute(
            "SELECT consumer, count(*) FROM outboxkit.inbox_rejection GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert left == [("billing", YOUNG), ("fresh", 1), ("shipping", 1)]
    assert rejections == [("billing", YOUNG)]
