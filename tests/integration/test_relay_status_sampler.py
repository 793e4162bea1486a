"""The sampler reads holders every interval and counts the backlog only as its cost allows."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from outboxkit import db
from outboxkit.relay import status_sampler
from outboxkit.relay.metrics import RelayMetrics

pytestmark = pytest.mark.integration

_FILL = """
INSERT INTO outboxkit.outbox_message
    (event_id, idempotency_key, content_digest, topic, message_key, payload, shard)
SELECT gen_random_uuid(), 'k' || g || '-' || %(batch)s, '\\x00', 'orders', 'key', '\\x7b7d', 0
FROM generate_series(1, %(rows)s) AS g
"""


def _gauge(metric: Any, shard: str) -> float:
    value: float = metric.labels(shard)._value.get()
    return value


async def test_holders_are_read_every_interval_while_a_costly_count_waits(
    outboxkit_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(_FILL, {"rows": 10, "batch": 1})
    # As if the first count had been expensive: the next one is an hour away.
    monkeypatch.setattr(status_sampler, "backlog_delay", lambda every, took: 3600.0)
    done: asyncio.Queue[str] = asyncio.Queue()
    real_rows = db.rows_async

    async def recorded(conn: Any, query: db.Query, params: Any = None) -> Sequence[Any]:
        found = await real_rows(conn, query, params)
        done.put_nowait(query.name)
        return found

    monkeypatch.setattr(status_sampler.db, "rows_async", recorded)
    metrics, stop = RelayMetrics(), asyncio.Event()
    task = asyncio.create_task(
        status_sampler.sample_forever(
            outboxkit_db_url, "outboxkit", "default", metrics, stop, every=0.01
        )
    )
    try:
        # The count, then the first holders read (it begins after the count's gauges are set).
        assert [await asyncio.wait_for(done.get(), 30) for _ in range(2)] == ["status", "holders"]
        assert _gauge(metrics.backlog, "0") == 10
        assert _gauge(metrics.group_active, "0") == 0
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(_FILL, {"rows": 5, "batch": 2})
            db.one(
                conn,
                db.query("relay", "lease_acquire", "outboxkit"),
                {"group": "default", "shard": 0, "holder": "h", "ttl": 60, "now": None},
            )
        # Holders read after the lease was taken: twice, so the second began after it.
        assert [await asyncio.wait_for(done.get(), 30) for _ in range(2)] == ["holders"] * 2
        while not done.empty():
            assert done.get_nowait() == "holders"
        assert _gauge(metrics.group_active, "0") == 1
        assert _gauge(metrics.backlog, "0") == 10  # not counted again
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
