"""The relay's sampled gauges: backlog, oldest pending age, parked rows, group holders.

Counting a shard's pending rows walks every one of them: about 0.3 s of PostgreSQL's CPU with
200,000 pending on the 2-core machine of docs/relay.md. Taken every second, the samples cost a
draining relay's database about a third of a core, just when the backlog needs it. So the pause
after a sample grows with what the sample took, and sampling stays a small share of the time.
"""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg

from outboxkit import db
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.waiting import wait_any

logger = logging.getLogger(__name__)

# At most this share of the time is spent waiting for the sample's statement.
DUTY = 0.05


def sample_delay(base: float, took: float) -> float:
    """Seconds from one sample's end to the next: ``base``, or longer when a sample that took
    ``took`` seconds would otherwise be more than ``DUTY`` of the cycle."""
    return max(base, took * (1 - DUTY) / DUTY)


async def sample_forever(
    url: db.Url,
    schema: str,
    group: str,
    metrics: RelayMetrics,
    stop: asyncio.Event,
    *,
    every: float,
) -> None:
    """Set the gauges every ``every`` seconds at most (see :func:`sample_delay`) until ``stop``."""
    status = db.query("relay", "status", schema)
    params = {"group": group}
    while not stop.is_set():
        try:
            async with await db.connect_async(
                url, application_name="outboxkit-relay-sample"
            ) as conn:
                while not stop.is_set():
                    started = time.monotonic()
                    rows = await db.rows_async(conn, status, params)
                    took = time.monotonic() - started
                    for row in rows:
                        label = str(row[0])
                        metrics.group_active.labels(label).set(1 if row[4] else 0)
                        metrics.backlog.labels(label).set(row[5])
                        metrics.oldest_pending.labels(label).set(float(row[6] or 0))
                        metrics.parked_rows.labels(label).set(row[7])
                    await wait_any([stop], sample_delay(every, took))
        except (psycopg.Error, OSError) as exc:
            logger.info("status sampling failed: %s", exc)
            await wait_any([stop], 2.0)
