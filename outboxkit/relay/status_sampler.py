"""The relay's sampled gauges: backlog, oldest pending age, parked rows, group holders.

Counting a shard's pending rows walks every one of them: about 0.3 s of PostgreSQL's CPU with
200,000 pending on the 2-core machine of docs/relay.md. Taken every second, the counts cost a
draining relay's database about a third of a core, just when the backlog needs it. So the
backlog is counted again only after a pause that grows with what the last count took, while the
holders and parked rows (cheap whatever the backlog; /healthz and the alerts read them) are
read every interval. And a process counts only the shards it holds and those nobody holds, on
a budget scaled by its share of the shards: counting costs a group of N relay processes
``DUTY`` of one database backend's time, not N times that, and the shard that lost its holder
(what /healthz looks for) is counted by every process, at the next interval.
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

# At most this share of the time is spent counting backlogs, by the whole group of processes.
DUTY = 0.05


def backlog_delay(every: float, took: float, share: float = 1.0) -> float:
    """Seconds from one backlog count's end to the next: ``every``, or longer when a count that
    took ``took`` seconds would otherwise be more than ``DUTY`` of the cycle.

    ``share``: the part of the group's shards this count walked. The others are walked by the
    processes holding them, each on the same budget scaled by its share, so counting costs the
    group ``DUTY`` of the time, not ``DUTY`` per process, and each gauge is as fresh as if one
    process counted every shard.
    """
    return max(every, took * (1 - DUTY) / (DUTY * share))


async def sample_forever(
    url: db.Url,
    schema: str,
    group: str,
    holder: str,
    metrics: RelayMetrics,
    stop: asyncio.Event,
    *,
    every: float,
) -> None:
    """Holders and parked rows every ``every`` seconds, the backlogs ``holder`` counts (see the
    module) as :func:`backlog_delay` allows, until ``stop``.

    The first count waits one interval, so a process that is starting counts the shards it has
    taken by then, not every shard of the group."""
    holders = db.query("relay", "holders", schema)
    status = db.query("relay", "status", schema)
    walk_only = db.query("relay", "pending_walk_only", schema)
    params = {"group": group, "holder": holder}
    while not stop.is_set():
        try:
            async with await db.connect_async(
                url, application_name="outboxkit-relay-sample"
            ) as conn:
                count_due = time.monotonic() + every
                counted: set[int] = set()  # the shards whose backlog gauges this process set
                while not stop.is_set():
                    if time.monotonic() >= count_due:
                        started = time.monotonic()
                        async with conn.transaction():
                            await db.execute_async(conn, walk_only)
                            rows = await db.rows_async(conn, status, params)
                        took = time.monotonic() - started
                        share = sum(1 for row in rows if row[-1]) / len(rows) if rows else 0
                        count_due = time.monotonic() + backlog_delay(every, took, share or 1.0)
                        for shard, *_, active, backlog, oldest, parked, counts in rows:
                            _set_holder(metrics, shard, active, parked)
                            if counts:
                                counted.add(shard)
                                metrics.backlog.labels(str(shard)).set(backlog)
                                metrics.oldest_pending.labels(str(shard)).set(float(oldest or 0))
                            else:
                                _forget_backlog(metrics, counted, shard)
                    else:
                        for shard, active, parked, counts in await db.rows_async(
                            conn, holders, params
                        ):
                            _set_holder(metrics, shard, active, parked)
                            if not counts:
                                _forget_backlog(metrics, counted, shard)
                            elif shard not in counted:  # e.g. its holder is gone: count it now
                                count_due = min(count_due, time.monotonic())
                    await wait_any([stop], every)
        except (psycopg.Error, OSError) as exc:
            logger.info("status sampling failed: %s", exc)
            await wait_any([stop], 2.0)


def _set_holder(metrics: RelayMetrics, shard: int, active: bool, parked: int) -> None:
    metrics.group_active.labels(str(shard)).set(1 if active else 0)
    metrics.parked_rows.labels(str(shard)).set(parked)


def _forget_backlog(metrics: RelayMetrics, counted: set[int], shard: int) -> None:
    """Another process holds ``shard`` and reports its backlog: drop this process's series
    rather than export a figure that only grows stale."""
    if shard in counted:
        counted.discard(shard)
        metrics.backlog.remove(str(shard))
        metrics.oldest_pending.remove(str(shard))
