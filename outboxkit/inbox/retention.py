"""Bounded growth of the dedup table, and the check that keeps replays inside its window.

Dedup rows are what recognise a redelivery. Once a terminal row is deleted, a replay of that
event (offset reset, re-consumed topic) would be applied again, so the window must cover every
message still readable on the topic (``retention.ms``), and older replays are refused by
``InboxSettings.replay_window``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import time
from dataclasses import dataclass, replace

from sqlalchemy.engine import Engine

from outboxkit import db
from outboxkit.bounds import check_range, keep
from outboxkit.errors import RetentionWindowError
from outboxkit.inbox.guard import error_text
from outboxkit.inbox.steps import Plan, Sql
from outboxkit.kafka.api import Admin
from outboxkit.schema import DEFAULT_SCHEMA
from outboxkit.settings.models import CENTURY, DAY, MAX_RETENTION_BATCH

logger = logging.getLogger("outboxkit.inbox.retention")

_PURGES = ("delete_finished_batch", "delete_rejections_batch")


@dataclass(frozen=True)
class Retention:
    """Purge finished inbox rows and rejections older than ``window_seconds`` from the
    consumer loop: every ``every_seconds``, at most ``max_batches`` of ``batch_size`` rows per
    table, each batch its own short transaction (the loop waits for them, so keep them small).

    Bounds (see :func:`check_purge`): the window above 0 and at most a century, the interval
    above 0 and at most a day, ``batch_size`` 1 to 100,000, ``max_batches`` at least 1.
    """

    window_seconds: float
    every_seconds: float = 60.0
    batch_size: int = 500
    max_batches: int = 4

    def __post_init__(self) -> None:
        keep(
            self,
            window_seconds=check_purge(
                "Retention", self.window_seconds, self.batch_size, self.max_batches
            ),
            every_seconds=check_range(
                "Retention.every_seconds", self.every_seconds, 0, DAY, above=True, unit="seconds"
            ),
        )


def check_purge(
    where: str, window_seconds: float, batch_size: int, max_batches: int | None
) -> float:
    """A window of 0 or less (NaN compares false) would delete the dedup rows of events that
    finished just now, and their redelivery would be applied twice; a NaN or infinite one fails
    in PostgreSQL at every purge. ``max_batches`` below 1 would purge nothing, silently.
    Returns the window to keep (:func:`~outboxkit.bounds.check_range`)."""
    window = check_range(
        f"{where}.window_seconds", window_seconds, 0, CENTURY, above=True, unit="seconds"
    )
    check_range(f"{where}.batch_size", batch_size, 1, MAX_RETENTION_BATCH, integer=True)
    if max_batches is not None:
        check_range(f"{where}.max_batches", max_batches, 1, integer=True)
    return window


class Purger:
    """The consumer loop's retention timer (sans-IO: yields the DELETE statements).

    ``consumer``: whose rows it purges, the loop's own. Each consumer keeps its rows for its own
    window, so one consumer's purge must never delete another's. ``replay_window``: the
    consumer's dedup window; a replay inside it is accepted and only its row tells it from a
    new event, so a shorter retention window is raised to it (and said).
    """

    def __init__(
        self,
        schema: str,
        retention: Retention | None,
        now: float,
        *,
        consumer: str,
        replay_window: float | None = None,
    ) -> None:
        if retention and replay_window and retention.window_seconds < replay_window:
            logger.warning(
                "the retention window (%.0f s) is shorter than the replay window (%.0f s):"
                " inbox rows are purged %.0f s after they finish instead, so that the replays"
                " the window accepts are still recognised",
                retention.window_seconds,
                replay_window,
                replay_window,
            )
            retention = replace(retention, window_seconds=replay_window)
        self.retention = retention
        self.consumer = consumer
        self.queries = db.queries("inbox", schema)
        self.next_at = now  # the first purge runs at start-up
        self.deleted = 0

    def run_due(self, now: float) -> Plan[int]:
        """Purge if due; a failure is logged and tried again at the next interval."""
        retention = self.retention
        if retention is None or now < self.next_at:
            return 0
        self.next_at = now + retention.every_seconds
        params = {
            "consumer": self.consumer,
            "window_seconds": retention.window_seconds,
            "batch_size": retention.batch_size,
            "now": None,
        }
        deleted = 0
        try:
            for name in _PURGES:
                for _ in range(retention.max_batches):
                    result: db.Result = yield Sql(self.queries[name], params)
                    deleted += result.rowcount
                    if result.rowcount < retention.batch_size:
                        break
        except Exception as exc:
            logger.warning("inbox retention purge failed (next try later): %s", error_text(exc))
        if deleted:
            logger.info("inbox retention purged %d rows", deleted)
        self.deleted += deleted
        return deleted


@dataclass(frozen=True)
class PurgeResult:
    messages: int
    rejections: int
    batches: int


def purge_finished(
    engine: Engine,
    *,
    consumer: str | None,
    window_seconds: float,
    batch_size: int = 1000,
    max_batches: int | None = None,
    pause_seconds: float = 0.0,
    schema: str = DEFAULT_SCHEMA,
    now: dt.datetime | None = None,
) -> PurgeResult:
    """Delete terminal rows (and rejections) of ``consumer`` finished more than
    ``window_seconds`` before ``now`` (default: the database clock), one small batch per
    transaction, at most ``max_batches`` per table; ``pause_seconds`` (at most a day) between
    batches. Bounds as :class:`Retention`'s.

    ``consumer`` has no default: each consumer keeps its rows for its own window, so the caller
    names the one whose window this is, or passes ``None`` to purge every consumer's rows: then
    each consumer with old rows is purged in turn, by the same index range scans (no index
    orders every consumer's rows by age, and every row past the window goes either way).
    """
    window_seconds = check_purge("purge_finished", window_seconds, batch_size, max_batches)
    pause_seconds = check_range(
        "purge_finished.pause_seconds", pause_seconds, 0, DAY, unit="seconds"
    )
    params = {
        "consumer": consumer,
        "window_seconds": window_seconds,
        "batch_size": batch_size,
        "now": now,
    }
    queries = db.queries("inbox", schema)
    consumers: list[str | None] = [consumer]
    if consumer is None:
        with engine.begin() as conn:
            consumers = [found for (found,) in db.rows(conn, queries["purge_consumers"], params)]
    totals = dict.fromkeys(_PURGES, 0)
    batches = 0
    for name in _PURGES:
        # counted per table: a full message backlog must not starve the rejection log
        budget = itertools.count() if max_batches is None else iter(range(max_batches))
        for each in consumers:
            params["consumer"] = each
            for _ in budget:  # shared by the consumers: max_batches per table
                with engine.begin() as conn:
                    deleted = db.execute(conn, queries[name], params)
                batches += 1
                totals[name] += deleted
                if deleted < batch_size:
                    break
                if pause_seconds:
                    time.sleep(pause_seconds)
    messages, rejections = (totals[name] for name in _PURGES)
    return PurgeResult(messages, rejections, batches)


async def topic_retention_ms(admin: Admin, topic: str) -> int | None:
    """``retention.ms`` of a topic (None: kept forever, or not set)."""
    value = await admin.topic_config(topic, "retention.ms")
    if value is None:
        return None
    retention = int(value)
    return None if retention < 0 else retention


async def check_window(
    admin: Admin, topics: list[str], window_seconds: float, *, strict: bool = False
) -> list[str]:
    """Warnings for topics that keep messages longer than the dedup rows are kept.

    ``retention.ms = -1`` (infinite) always warns. With ``strict`` the first problem raises
    :class:`RetentionWindowError` instead. The admin client comes from
    ``KafkaClients(settings).admin()``.
    """
    problems = []
    for topic in topics:
        retention = await topic_retention_ms(admin, topic)
        if retention is None or retention / 1000.0 > window_seconds:
            kept = "forever" if retention is None else f"{retention / 1000.0:.0f} s"
            problems.append(
                f"topic {topic!r} keeps messages {kept} but dedup rows are kept"
                f" {window_seconds:.0f} s: replays older than the window are refused"
                " (set InboxSettings.replay_window) or would be re-applied"
            )
    for problem in problems:
        if strict:
            raise RetentionWindowError(problem)
        logger.warning(problem)
    return problems
