"""Bounded growth of the dedup table, and the check that keeps replays inside its window.

Dedup rows are what recognise a redelivery. Once a terminal row is deleted, a replay of that
event (offset reset, re-consumed topic) would be applied again, so the window must cover every
message still readable on the topic (``retention.ms``), and older replays are refused by
``InboxSettings.replay_window``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from outboxkit.errors import RetentionWindowError
from outboxkit.migrator import DEFAULT_SCHEMA
from outboxkit.queries import query

logger = logging.getLogger("outboxkit.inbox.retention")


@dataclass(frozen=True)
class PurgeResult:
    messages: int
    rejections: int
    batches: int


def purge_finished(
    engine: Engine,
    *,
    window_seconds: float,
    batch_size: int = 1000,
    max_batches: int | None = None,
    pause_seconds: float = 0.0,
    schema: str = DEFAULT_SCHEMA,
) -> PurgeResult:
    """Delete terminal rows finished more than ``window_seconds`` ago, one small batch per tx."""
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    params = {"window_seconds": window_seconds, "batch_size": batch_size}
    totals = {"delete_finished_batch": 0, "delete_rejections_batch": 0}
    batches = 0
    for name in totals:
        while max_batches is None or batches < max_batches:
            with engine.begin() as conn:
                deleted = conn.execute(text(query("inbox", name, schema)), params).rowcount
            batches += 1
            totals[name] += deleted
            if deleted < batch_size:
                break
            if pause_seconds:
                time.sleep(pause_seconds)
    return PurgeResult(totals["delete_finished_batch"], totals["delete_rejections_batch"], batches)


def topic_retention_ms(admin: Any, topic: str, timeout: float = 30.0) -> int | None:
    """``retention.ms`` of a topic via confluent-kafka ``AdminClient.describe_configs``."""
    from confluent_kafka import admin as kafka_admin

    config_resource: Any = kafka_admin.ConfigResource  # type: ignore[attr-defined]
    resource_type: Any = kafka_admin.ResourceType  # type: ignore[attr-defined]

    resource = config_resource(resource_type.TOPIC, topic)
    futures = admin.describe_configs([resource], request_timeout=timeout)
    configs = next(iter(futures.values())).result(timeout=timeout)
    entry = configs.get("retention.ms")
    if entry is None or entry.value is None:
        return None
    value = int(entry.value)
    return None if value < 0 else value


def check_window(
    admin: Any, topics: list[str], window_seconds: float, *, strict: bool = False
) -> list[str]:
    """Warnings for topics that keep messages longer than the dedup rows are kept.

    ``retention.ms = -1`` (infinite) always warns. With ``strict`` the first problem raises
    :class:`RetentionWindowError` instead.
    """
    problems = []
    for topic in topics:
        retention = topic_retention_ms(admin, topic)
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
