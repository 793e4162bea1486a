"""Rows of no shard (a shard number outside 0 .. shard_count - 1) are shard 0's: its holder's
retention and housekeeping delete the published and discarded rows a lowered shard count left
behind, and parked rows of no shard count (gauge, `relay status`) and age out under shard 0."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from outboxkit import db
from outboxkit.relay.housekeeping import Housekeeping
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.reader import ShardStore
from outboxkit.settings import load_settings
from tests.relay_support import (
    SCHEMA,
    cli_ok,
    day_lease,
    insert_rows,
    payloads,
    set_shard_count,
)

pytestmark = pytest.mark.integration

KEYS = [f"key-{n}" for n in range(24)]  # spread over the 4 shards


def _term(url: str, shard: int = 0) -> LeaseTerm:
    return day_lease(url, shard)


@pytest.fixture
async def conn(outboxkit_db_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(outboxkit_db_url, autocommit=True) as c:
        yield c


def _shards_by_state(url: str) -> dict[str, list[int]]:
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(
            f"SELECT state, shard FROM {SCHEMA}.outbox_message ORDER BY state, shard"
        ).fetchall()
    out: dict[str, list[int]] = {}
    for state, shard in rows:
        out.setdefault(str(state), []).append(int(shard))
    return out


def _settle(url: str, state: str, hours: float) -> None:
    """Every row: ``state``, published or parked ``hours`` ago."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(
            f"UPDATE {SCHEMA}.outbox_message SET state = %(state)s,"
            " published_at = CASE WHEN %(state)s = 'published'"
            "     THEN now() - %(hours)s * interval '1 hour' END,"
            " parked_at = CASE WHEN %(state)s <> 'published'"
            "     THEN now() - %(hours)s * interval '1 hour' END",
            {"state": state, "hours": hours},
        )


@pytest.mark.parametrize("state", ["published", "discarded"])
async def test_rows_left_behind_by_a_lowered_shard_count_are_deleted_by_shard_0(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any], state: str
) -> None:
    set_shard_count(outboxkit_db_url, 4)
    insert_rows(outboxkit_db_url, "orders", [(key, b"{}") for key in KEYS])
    _settle(outboxkit_db_url, state, 2)
    assert set(_shards_by_state(outboxkit_db_url)[state]) == {0, 1, 2, 3}
    assert "shard count of schema outboxkit is now 1" in cli_ok(
        outboxkit_db_url, "relay", "shards", "1"
    )
    settings = load_settings(
        overrides={
            "database": {"url": outboxkit_db_url},
            "relay": {
                "retention_seconds": 3600,
                "discarded_retention_seconds": 3600,
                "retention_batch": 2,  # several batches
            },
        }
    )
    term = _term(outboxkit_db_url)
    if state == "published":
        store = ShardStore(SCHEMA)
        while await store.retention(conn, term, 3600, 2) == 2:
            pass
    else:
        await Housekeeping(settings.relay, SCHEMA).run_if_due(conn, term, asyncio.Event())
    assert _shards_by_state(outboxkit_db_url) == {}


async def test_shard_0_takes_only_old_rows_of_no_shard_and_other_shards_only_their_own(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    set_shard_count(outboxkit_db_url, 4)
    insert_rows(outboxkit_db_url, "orders", [(key, b"{}") for key in KEYS])
    _settle(outboxkit_db_url, "published", 2)
    set_shard_count(outboxkit_db_url, 2)  # shards 2 and 3 are of no shard now
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(
            f"UPDATE {SCHEMA}.outbox_message SET published_at = now()"
            " WHERE id IN (SELECT min(id) FROM outboxkit.outbox_message GROUP BY shard)"
        )  # one recent row per shard: inside the window, kept
    store = ShardStore(SCHEMA)
    assert await store.retention(conn, _term(outboxkit_db_url, 1), 3600, 1000) > 0
    assert set(_shards_by_state(outboxkit_db_url)["published"]) == {0, 1, 2, 3}
    assert _shards_by_state(outboxkit_db_url)["published"].count(1) == 1  # shard 1's own
    assert await store.retention(conn, _term(outboxkit_db_url, 0), 3600, 1000) > 0
    assert _shards_by_state(outboxkit_db_url) == {"published": [0, 1, 2, 3]}


async def test_parked_rows_of_no_shard_count_and_age_out_under_shard_0(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    set_shard_count(outboxkit_db_url, 2)
    [high] = insert_rows(outboxkit_db_url, "orders", payloads("high", 1))
    [low] = insert_rows(outboxkit_db_url, "orders", payloads("low", 1))
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        for row_id, shard in ((high, 7), (low, -1)):
            c.execute(
                f"UPDATE {SCHEMA}.outbox_message SET shard = %s WHERE id = %s", (shard, row_id)
            )
    settings = load_settings(overrides={"database": {"url": outboxkit_db_url}})
    term = _term(outboxkit_db_url)
    await Housekeeping(settings.relay, SCHEMA).run_if_due(conn, term, asyncio.Event())
    assert _shards_by_state(outboxkit_db_url) == {"parked": [-1, 7]}  # park_stray's work

    status = json.loads(cli_ok(outboxkit_db_url, "relay", "status", "--json"))
    assert [s["parked"] for s in status["shards"]] == [2, 0]
    # The gauge's statement (the sampler's holders read).
    holders = await db.rows_async(
        conn,
        db.query("relay", "holders", SCHEMA),
        {"group": "default", "holder": "me", "now": None},
    )
    assert [(int(shard), int(parked)) for shard, _, parked, _ in holders] == [(0, 2), (1, 0)]

    # Parked retention on: shard 1's holder leaves them, shard 0's deletes them.
    keep_an_hour = load_settings(
        overrides={
            "database": {"url": outboxkit_db_url},
            "relay": {"parked_retention_seconds": 3600},
        }
    )
    later = datetime.now(UTC) + timedelta(hours=2)
    await Housekeeping(keep_an_hour.relay, SCHEMA).run_if_due(
        conn, _term(outboxkit_db_url, 1), asyncio.Event(), now=later
    )
    assert _shards_by_state(outboxkit_db_url) == {"parked": [-1, 7]}
    await Housekeeping(keep_an_hour.relay, SCHEMA).run_if_due(
        conn, term, asyncio.Event(), now=later
    )
    assert _shards_by_state(outboxkit_db_url) == {}
