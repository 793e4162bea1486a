"""A backlog count that a ``statement_timeout`` cancels every time (a database setting shorter
than the walk of a large backlog): the holders and the pause flag are still read every
interval, so /healthz stays fresh while the relay works, and the failure is one line, not one
per attempt. Before, the count was retried first in every loop and failed there: nothing else
was read again, and /healthz failed with ``status_stale`` for as long as the backlog stayed."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from outboxkit import db
from outboxkit.relay import status_sampler
from outboxkit.relay.metrics import RelayMetrics
from tests.relay_support import cli_ok
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

# The timeout is a fifth of the count's walk, and applies to the sampler's other reads too (a
# database setting): with 150,000 rows it was ~5 ms, and a holders read that a busy CI machine
# held up past it made the sampler wait 2 s, /healthz stale. 500,000 give them ~15 ms.
ROWS = 500_000
STALE_AFTER = 1.0
FAILED = "backlog count failed"

_FILL = """
INSERT INTO outboxkit.outbox_message
    (event_id, idempotency_key, content_digest, topic, message_key, payload, shard)
SELECT gen_random_uuid(), 'k' || g, '\\x00', 'orders', 'key', '\\x7b7d', 0
FROM generate_series(1, %(rows)s) AS g
"""


def _count_ms(url: str) -> float:
    """What the sampler's backlog count of shard 0 takes without a timeout, in ms."""
    params = {"group": "default", "holder": "me", "only": None, "now": None}
    with psycopg.connect(url) as conn:
        db.execute(conn, db.query("relay", "pending_walk_only", "outboxkit"))
        began = time.monotonic()
        db.rows(conn, db.query("relay", "status", "outboxkit"), params)
        return (time.monotonic() - began) * 1000


async def test_holders_and_pause_are_read_while_the_count_times_out(
    outboxkit_db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(_FILL, {"rows": ROWS})
        conn.execute("VACUUM ANALYZE outboxkit.outbox_message")
    # A fifth of the quickest of five walks: a walk measured slow (the machine busy then) gave
    # a timeout a later, quicker walk finished within once, and /healthz saw its backlog. (A
    # tenth while the walk paid a JIT compile; without it the walk is ~23 ms.)
    took = min(_count_ms(outboxkit_db_url) for _ in range(5))
    timeout = int(took / 5)
    assert timeout >= 3, f"the count takes {took:.1f} ms: too fast to time out reliably"
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        name = conn.execute("SELECT current_database()").fetchone()
        assert name is not None
        conn.execute(f'ALTER DATABASE "{name[0]}" SET statement_timeout = {timeout}')

    counts = 0  # backlog counts the sampler began (the statements themselves are real)
    real_rows = db.rows_async

    async def rows_async(conn: Any, query: db.Query, params: Any = None) -> Sequence[Any]:
        nonlocal counts
        counts += query.name == "status"
        return await real_rows(conn, query, params)

    monkeypatch.setattr(status_sampler.db, "rows_async", rows_async)
    # The pause after a failed count is 19 times what it took (tested on its own): on a busy
    # machine one cancelled count took over 1.5 s and the next was due after this test's wait.
    # What is tested here is what is read between counts, so counts come every interval.
    monkeypatch.setattr(status_sampler, "backlog_delay", lambda every, took: every)
    caplog.set_level(logging.INFO, logger=status_sampler.logger.name)
    metrics, stop = RelayMetrics(), asyncio.Event()
    task = asyncio.create_task(
        status_sampler.sample_forever(
            outboxkit_db_url,
            "outboxkit",
            "default",
            "me",
            metrics,
            stop,
            every=0.05,
            stale_after=STALE_AFTER,
        )
    )
    try:
        began = time.monotonic()
        await wait_for_async(  # and longer than a sample stays fresh
            lambda: counts >= 3 and time.monotonic() - began > 2 * STALE_AFTER,
            within=60,
            what="three backlog counts",
        )
        ok, detail = metrics.healthy()
        assert ok, detail
        cli_ok(outboxkit_db_url, "relay", "pause", "--reason", "test")
        await wait_for_async(lambda: metrics.paused._value.get() == 1, what="the pause read")
        lines = [r for r in caplog.records if FAILED in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in lines]  # one for all those attempts
        assert "statement timeout" in lines[0].getMessage()
        # (Once another process holds the shard, this one's count walks nothing and succeeds.)
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            db.one(
                conn,
                db.query("relay", "lease_acquire", "outboxkit"),
                {"group": "default", "shard": 0, "holder": "other", "ttl": 60, "now": None},
            )
        active = metrics.group_active.labels("0")
        await wait_for_async(lambda: active._value.get() == 1, what="the new holder read")
        assert metrics.healthy()[0]
        assert metrics.backlog.collect()[0].samples == []  # never counted: no figure
        assert "status sampling failed" not in caplog.text
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
