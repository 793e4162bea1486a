"""Connections are bounded: standby shards of a process share one connection; only shards a
process holds have their own (lease renewal + data).

64 shards, two relay processes' worth of workers (in-process): the first holds every shard, the
second is standby for all of them. The group is paused, so no Kafka producer is needed.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.relay_support import (
    relay_settings,
    running_relay,
    set_shard_count,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

SHARDS = 64


def _relay_connections(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'outboxkit-relay%'"
            " GROUP BY 1"
        ).fetchall()
    by_kind: dict[str, int] = {}
    for name, count in rows:
        kind = "shard" if str(name).removeprefix("outboxkit-relay-").isdigit() else str(name)
        by_kind[kind] = by_kind.get(kind, 0) + int(count)
    return by_kind


async def test_standby_shards_share_one_connection_per_process(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str
) -> None:
    set_shard_count(outboxkit_db_url, SHARDS)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outboxkit.relay_control (relay_group, paused) VALUES ('default', true)"
        )
    settings = relay_settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, mode="at_least_once", lease_ttl=30.0
    )
    async with running_relay(settings, holder="first") as first:
        await wait_for_async(
            lambda: all(w.active.is_set() for w in first.workers.values()), what="all held"
        )
        async with running_relay(settings, holder="second") as second:
            assert len(second.workers) == SHARDS
            # Every standby worker has tried (and failed) to take its lease at least twice.
            standby = next(iter(second.workers.values()))._standby
            await wait_for_async(lambda: standby.opened >= 1, what="standby attempts")
            await wait_for_async(
                lambda: (
                    sum(1 for w in second.workers.values() if not w.active.is_set()) == SHARDS
                    and _relay_connections(outboxkit_db_url).get("outboxkit-relay-standby", 0) >= 2
                ),
                what="both processes' standby connections",
            )
            counts = _relay_connections(outboxkit_db_url)
            print(f"relay connections with {SHARDS} shards, two processes: {counts}")
            assert counts["shard"] == 2 * SHARDS  # the holder's renewal + data connections
            assert counts["outboxkit-relay-standby"] == 2  # one per process, whatever the shards
            assert sum(counts.values()) <= 2 * SHARDS + 6, counts
