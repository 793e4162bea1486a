"""The relay's sampled gauges: backlog, oldest pending age, parked rows, group holders.

Counting a shard's pending rows walks every one of them: about 0.3 s of PostgreSQL's CPU with
200,000 pending on the 2-core machine of docs/relay.md. Taken every second, the counts cost a
draining relay's database about a third of a core, just when the backlog needs it. So the
backlog is counted again only after a pause that grows with what the last count took, while the
holders and parked rows (cheap whatever the backlog; /healthz and the alerts read them) are
read every interval. And a process counts only the shards it holds and those nobody holds: no
two processes walk a held shard's backlog, and none exports the backlog of a shard another holds.
A shard that just became one to count (its holder is gone, which /healthz looks for; or this
process took it) is walked at the next interval, whatever the pause: alone, or in the full
count when that is due by then. A count that fails while the connection stays (a
``statement_timeout`` shorter than the walk) waits that pause too, urgent or not; the holders
and the pause flag are still read every interval, and its gauges keep their last values.

Every interval whose holders and pause flag were read is recorded (``RelayMetrics.sampled``,
with the group's pause flag): while the database cannot be read the gauges keep their last
values, and only that record tells that they are old (/healthz then fails, an alert reads the
timestamp). Failures, of a count or of the whole sample (the database away for an hour: one
line every 2 s before), are logged rate-limited (:class:`LimitedLines`): one line, then one a
minute with the count of the others, and a line when it works again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from outboxkit import db
from outboxkit.db.availability import with_pooler_hint
from outboxkit.db.engines import ended_while_idle
from outboxkit.log_limit import LimitedLines, normalised
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.waiting import wait_any

logger = logging.getLogger("outboxkit.relay.status_sampler")

# At most this share of the time is spent counting backlogs (a process's full counts).
DUTY = 0.05


def backlog_delay(every: float, took: float) -> float:
    """Seconds from one backlog count's end to the next: ``every``, or longer when a count that
    took ``took`` seconds would otherwise be more than ``DUTY`` of the cycle."""
    return max(every, took * (1 - DUTY) / DUTY)


class CountedShards:
    """The shards whose backlog gauges this process exports, and whether each had a holder
    when it was counted: what decides that a shard needs a count of its own now."""

    def __init__(self) -> None:
        self._active: dict[int, bool] = {}

    def __contains__(self, shard: int) -> bool:
        return shard in self._active

    def counted(self, shard: int, active: bool) -> None:
        self._active[shard] = active

    def forget(self, shard: int) -> bool:
        """True when ``shard`` was counted here (its series are to be dropped)."""
        return self._active.pop(shard, None) is not None

    def needs_count(self, shard: int, active: bool) -> bool:
        """A shard this process is to count (``counts`` in the holders read): at once when never
        counted here, or when it had a holder at its count and has none now (its gauge would
        keep a held shard's old figure while /healthz looks for exactly this shard)."""
        was_active = self._active.get(shard)
        return was_active is None or (was_active and not active)


async def sample_forever(
    url: db.Url,
    schema: str,
    group: str,
    holder: str,
    metrics: RelayMetrics,
    stop: asyncio.Event,
    *,
    every: float,
    connect_options: dict[str, Any] | None = None,
    stale_after: float | None = None,
    now: datetime | None = None,
    track: db.OpenConnections | None = None,
) -> None:
    """Holders, parked rows and the pause flag every ``every`` seconds, the backlogs ``holder``
    counts (see the module) as :func:`backlog_delay` allows, until ``stop``. ``stale_after``:
    seconds without a successful sample after which /healthz fails (None: never). ``now``
    (tests only) replaces the database clock in lease expiry and pending age.

    The first full count comes one interval after the start: a process that takes its shards
    within that interval counts those (and any nobody holds yet), not every shard of the
    group."""
    holders = db.query("relay", "holders", schema)
    status = db.query("relay", "status", schema)
    walk_only = db.query("relay", "pending_walk_only", schema)
    paused = db.query("relay", "control_paused", schema)
    if stale_after is not None:
        metrics.expect_samples(stale_after)
    # All four outlive a reconnect: the series this process set must still be dropped, a full
    # count that keeps failing (a statement timeout, say) must still wait its pause, and a
    # shard found to need a count must still get it (a connection the server ends while idle
    # is replaced between the read that found it and the count), but not before a failed
    # count's pause is over.
    counted = CountedShards()
    count_due = time.monotonic() + every
    urgent: set[int] = set()  # shards to count alone, now (kept across a reconnect)
    held_until = 0.0  # no count before: the pause of one that failed
    said = LimitedLines(logger)  # whole samples failed: the database away, say
    count_said = LimitedLines(logger)  # counts failed while the rest was read
    while not stop.is_set():
        full_since = None  # while a full count runs: when it began
        try:
            async with db.connection_async(
                url,
                application_name="outboxkit-relay-sample",
                track=track,
                **(connect_options or {}),
            ) as conn:
                while not stop.is_set():
                    tick = time.monotonic()
                    may = tick >= held_until
                    # A full count due within the interval stands in for the urgent one.
                    full = tick >= count_due or (may and bool(urgent) and count_due - tick <= every)
                    rows = None
                    if full or (urgent and may):
                        full_since = tick if full else None
                        only = None if full else sorted(urgent)
                        params = {"group": group, "holder": holder, "only": only, "now": now}
                        metrics.counting(full)
                        try:
                            async with conn.transaction():
                                await db.execute_async(conn, walk_only)
                                rows = await db.rows_async(conn, status, params)
                        except psycopg.Error as exc:
                            if conn.broken or stop.is_set():
                                raise
                            # The holders and the pause flag are still read, every interval.
                            count_due = held_until = _next_count(every, tick)
                            full_since = None
                            _count_failed(count_said, exc, count_due)
                        finally:
                            metrics.counting(False)
                    if rows is not None:
                        if full:
                            count_due = _next_count(every, tick)
                            full_since = None
                        urgent.clear()
                        _counted(metrics, counted, rows)
                        count_said.answered()
                        count_said.end(logging.INFO, "backlog counts work again after %.1f s")
                    else:
                        params = {"group": group, "holder": holder, "now": now}
                        found = await db.rows_async(conn, holders, params)
                        urgent |= _held(metrics, counted, found)
                    flag = await db.one_async(conn, paused, {"group": group})
                    metrics.sampled(bool(flag and flag[0]))
                    said.answered()
                    said.end(logging.INFO, "status sampling works again after %.1f s")
                    await wait_any([stop], every)
                    if ended_while_idle(conn):  # an idle_session_timeout, a restart: a new one
                        break
        except (psycopg.Error, OSError) as exc:
            if full_since is not None:
                count_due = _next_count(every, full_since)
            kind = normalised(f"{type(exc).__name__}: {exc}")
            text = with_pooler_hint(str(exc), exc)
            said.log(logging.INFO, kind, "status sampling failed: %s", text)
            await wait_any([stop], 2.0)


def _count_failed(said: LimitedLines, exc: psycopg.Error, due: float) -> None:
    """A failed backlog count, said (rate-limited): its gauges keep their last values."""
    said.log(
        logging.WARNING,
        normalised(f"{type(exc).__name__}: {exc}"),
        "backlog count failed: %s; backlog gauges keep their last values, next count in %.1f s",
        with_pooler_hint(str(exc), exc),
        max(0.0, due - time.monotonic()),
    )


def _next_count(every: float, began: float) -> float:
    """When the next full count is due, after one that began at ``began`` ended (now)."""
    now = time.monotonic()
    return now + backlog_delay(every, now - began)


def _counted(metrics: RelayMetrics, counted: CountedShards, rows: Sequence[Any]) -> None:
    """Gauges from a count: a walked shard's backlog set, a shard another process holds
    dropped; a shard that counts but was not walked (not in ``only``) left as it was."""
    for shard, *_, active, backlog, oldest, parked, counts, walked in rows:
        _set_holder(metrics, shard, active, parked)
        if walked:
            counted.counted(shard, active)
            metrics.backlog.labels(str(shard)).set(backlog)
            metrics.oldest_pending.labels(str(shard)).set(float(oldest or 0))
        elif not counts:
            _forget_backlog(metrics, counted, shard)


def _held(metrics: RelayMetrics, counted: CountedShards, rows: Sequence[Any]) -> set[int]:
    """Gauges from a holders read; returns the shards to count alone, now."""
    urgent = set()
    for shard, active, parked, counts in rows:
        _set_holder(metrics, shard, active, parked)
        if not counts:
            _forget_backlog(metrics, counted, shard)
        elif counted.needs_count(shard, active):
            urgent.add(shard)
    return urgent


def _set_holder(metrics: RelayMetrics, shard: int, active: bool, parked: int) -> None:
    metrics.group_active.labels(str(shard)).set(1 if active else 0)
    metrics.parked_rows.labels(str(shard)).set(parked)


def _forget_backlog(metrics: RelayMetrics, counted: CountedShards, shard: int) -> None:
    """Another process holds ``shard`` and reports its backlog: drop this process's series
    rather than export a figure that only grows stale."""
    if counted.forget(shard):
        metrics.backlog.remove(str(shard))
        metrics.oldest_pending.remove(str(shard))
