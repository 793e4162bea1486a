"""The relay's sampled gauges: backlog, oldest pending age, parked rows, group holders.

Counting a shard's pending rows walks every one of them: about 0.3 s of PostgreSQL's CPU with
200,000 pending on the 2-core machine of docs/relay.md. Taken every second, the counts cost a
draining relay's database about a third of a core, just when the backlog needs it. So the
backlog is counted again only after a pause that grows with what the last count took, while the
holders and parked rows (cheap whatever the backlog; /healthz and the alerts read them) are
read every interval.
"""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg

from outboxkit import db
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.waiting import wait_any

logger = logging.getLogger("outboxkit.relay.status_sampler")

# At most this share of the time is spent counting backlogs.
DUTY = 0.05


def backlog_delay(every: float, took: float) -> float:
    """Seconds from one backlog count's end to the next: ``every``, or longer when a count that
    took ``took`` seconds would otherwise be more than ``DUTY`` of the cycle."""
    return max(every, took * (1 - DUTY) / DUTY)


async def sample_forever(
    url: db.Url,
    schema: str,
    group: str,
    metrics: RelayMetrics,
    stop: asyncio.Event,
    *,
    every: float,
) -> None:
    """Holders and parked rows every ``every`` seconds, backlogs as :func:`backlog_delay` allows,
    until ``stop``."""
    holders = db.query("relay", "holders", schema)
    status = db.query("relay", "status", schema)
    walk_only = db.query("relay", "pending_walk_only", schema)
    params = {"group": group}
    while not stop.is_set():
        try:
            async with await db.connect_async(
                url, application_name="outboxkit-relay-sample"
            ) as conn:
                count_due = time.monotonic()
                while not stop.is_set():
                    if time.monotonic() >= count_due:
                        started = time.monotonic()
                        async with conn.transaction():
                            await db.execute_async(conn, walk_only)
                            rows = await db.rows_async(conn, status, params)
                        took = time.monotonic() - started
                        count_due = time.monotonic() + backlog_delay(every, took)
                        for row in rows:
                            metrics.backlog.labels(str(row[0])).set(row[5])
                            metrics.oldest_pending.labels(str(row[0])).set(float(row[6] or 0))
                            _set_holder(metrics, row[0], row[4], row[7])
                    else:
                        for shard, active, parked in await db.rows_async(conn, holders, params):
                            _set_holder(metrics, shard, active, parked)
                    await wait_any([stop], every)
        except (psycopg.Error, OSError) as exc:
            logger.info("status sampling failed: %s", exc)
            await wait_any([stop], 2.0)


def _set_holder(metrics: RelayMetrics, shard: int, active: bool, parked: int) -> None:
    metrics.group_active.labels(str(shard)).set(1 if active else 0)
    metrics.parked_rows.labels(str(shard)).set(parked)
