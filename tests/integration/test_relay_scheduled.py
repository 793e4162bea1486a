"""Rows scheduled for later wait in 'scheduled', out of the claim's walk, and come back when due.

Every claim walks its shard's pending rows in id order; 300,000 rows scheduled for the next day
below the due ones made each claim of their shard about 40 ms instead of 1 (benchmarks/
relay_scheduled.py). The shard's holder now moves them out (``schedule_rows``, fenced) and back
once due, with their ids: their place among their key's due rows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from outboxkit import db
from outboxkit.db.queries import Query
from outboxkit.errors import LeaseLostError
from outboxkit.relay.housekeeping import Housekeeping
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.reader import ShardStore
from outboxkit.settings import load_settings
from tests.relay_support import (
    SCHEMA,
    consume,
    insert_rows,
    payloads,
    relay_settings,
    running_relay,
    set_shard_count,
    states_by_key,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

AT = datetime(2101, 1, 1, tzinfo=UTC)  # the tests' clock: far ahead of the database's
SECOND = timedelta(seconds=1)


def _term(url: str, shard: int = 0, now: datetime | None = AT) -> LeaseTerm:
    """A day's lease as of ``now``: held at the tests' clock."""
    day = 24 * 3600
    with psycopg.connect(url, autocommit=True) as conn:
        row = db.one(
            conn,
            db.query("relay", "lease_acquire", SCHEMA),
            {"group": "default", "shard": shard, "holder": "me", "ttl": day, "now": now},
        )
    assert row is not None
    return LeaseTerm("default", shard, "me", int(row[0]), float(day), time.monotonic() + day)


@pytest.fixture
async def conn(outboxkit_db_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(outboxkit_db_url, autocommit=True) as c:
        yield c


def _schedule(url: str, due: dict[int, datetime | None]) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        for row_id, at in due.items():
            c.execute(
                f"UPDATE {SCHEMA}.outbox_message SET deliver_after = %s WHERE id = %s",
                (at, row_id),
            )


def _states(url: str) -> dict[int, str]:
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(f"SELECT id, state FROM {SCHEMA}.outbox_message ORDER BY id").fetchall()
    return {int(i): str(s) for i, s in rows}


async def test_rows_wait_out_of_the_claim_and_come_back_in_id_order_when_due(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    first, second, plain, third = insert_rows(outboxkit_db_url, "t", payloads("k", 4))
    _schedule(outboxkit_db_url, {first: AT + 2 * SECOND, second: AT + SECOND, third: AT + SECOND})
    store, term = ShardStore(SCHEMA), _term(outboxkit_db_url)
    assert await store.schedule(conn, term, 10, now=AT) == (3, 0)
    assert set(_states(outboxkit_db_url).values()) == {"scheduled", "pending"}
    assert _states(outboxkit_db_url)[plain] == "pending"
    # A claim passes scheduled rows by, even at a clock past their time.
    assert [r.id for r in await store.claim(conn, 0, 10, now=AT + 3 * SECOND)] == [plain]
    assert await store.schedule(conn, term, 10, now=AT + SECOND) == (0, 2)
    found = await store.claim(conn, 0, 10, now=AT + SECOND)
    assert [r.id for r in found] == [second, plain, third]  # id order: their places by key
    assert await store.schedule(conn, term, 10, now=AT + 3 * SECOND) == (0, 1)
    assert [r.id for r in await store.claim(conn, 0, 10, now=AT + 3 * SECOND)] == [
        first,
        second,
        plain,
        third,
    ]


async def test_moves_are_bounded_and_leave_rows_not_yet_due(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    ids = insert_rows(outboxkit_db_url, "t", payloads("k", 7))
    _schedule(outboxkit_db_url, {row_id: AT + n * SECOND for n, row_id in enumerate(ids)})
    store, term = ShardStore(SCHEMA), _term(outboxkit_db_url)
    assert await store.schedule(conn, term, 3, now=AT) == (3, 0)  # ids[0] is due at AT
    assert await store.schedule(conn, term, 3, now=AT) == (3, 0)
    assert await store.schedule(conn, term, 3, now=AT) == (0, 0)
    assert await store.schedule(conn, term, 3, now=AT + 4 * SECOND) == (0, 3)
    assert await store.schedule(conn, term, 3, now=AT + 4 * SECOND) == (0, 1)
    states = _states(outboxkit_db_url)
    assert [states[i] for i in ids] == ["pending"] * 5 + ["scheduled"] * 2


async def test_a_scheduled_row_whose_time_was_cleared_by_hand_comes_back(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """An operator who sends a scheduled row now (``deliver_after = NULL``) must not strand it:
    it leaves the moves' index only by coming back."""
    set_shard_count(outboxkit_db_url, 1)
    [row_id] = insert_rows(outboxkit_db_url, "t", payloads("k", 1))
    _schedule(outboxkit_db_url, {row_id: AT + 3600 * SECOND})
    store, term = ShardStore(SCHEMA), _term(outboxkit_db_url)
    assert await store.schedule(conn, term, 10, now=AT) == (1, 0)
    _schedule(outboxkit_db_url, {row_id: None})
    assert await store.schedule(conn, term, 10, now=AT) == (0, 1)
    assert [r.id for r in await store.claim(conn, 0, 10, now=AT)] == [row_id]


async def test_moves_are_fenced(outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]) -> None:
    set_shard_count(outboxkit_db_url, 1)
    [row_id] = insert_rows(outboxkit_db_url, "t", payloads("k", 1))
    _schedule(outboxkit_db_url, {row_id: AT + SECOND})
    store, old = ShardStore(SCHEMA), _term(outboxkit_db_url)
    _term(outboxkit_db_url)  # a newer holder's token
    with pytest.raises(LeaseLostError):
        await store.schedule(conn, old, 10, now=AT)
    assert _states(outboxkit_db_url) == {row_id: "pending"}
    assert old.lost_reason is not None


async def test_the_moves_read_only_the_rows_they_move(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """With statistics that know none of the rows (analysed while the table held only published
    rows), the moves still read the schedule index and the primary key: no walk of the pending
    index, no read of the whole table (100,000 rows due at once took 49 s that way)."""
    set_shard_count(outboxkit_db_url, 1)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(
            f"INSERT INTO {SCHEMA}.outbox_message (event_id, idempotency_key, content_digest,"
            " topic, payload, state, published_at)"
            " SELECT gen_random_uuid(), 'p' || g, '\\x00', 't', '\\x00', 'published', now()"
            " FROM generate_series(1, 20000) g"
        )
        c.execute(f"ANALYZE {SCHEMA}.outbox_message")
    ids = insert_rows(outboxkit_db_url, "t", payloads("k", 30))
    _schedule(outboxkit_db_url, dict.fromkeys(ids[:20], AT + SECOND))
    term = _term(outboxkit_db_url)
    params = {**term.sql_params(AT), "limit": 1000}
    async with conn.transaction():
        await db.execute_async(conn, db.query("relay", "pending_walk_only", SCHEMA))
        query = db.query("relay", "schedule_rows", SCHEMA)
        explain = Query(query.area, query.name, "EXPLAIN " + query.text)
        plan = "\n".join(str(r[0]) for r in (await db.run_async(conn, explain, params)).rows)
    assert "Seq Scan" not in plan
    assert "outbox_message_pending_idx" not in plan
    assert plan.count("outbox_message_schedule_idx") == 3
    assert "outbox_message_pkey" in plan


async def test_rows_of_no_shard_that_wait_are_parked_by_shard_0(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """Moved to 'scheduled' under a larger shard count, then the count lowered: no holder would
    bring them back, so shard 0's housekeeping parks them like pending rows of no shard."""
    set_shard_count(outboxkit_db_url, 4)
    ids = insert_rows(outboxkit_db_url, "t", [(f"key-{n}", b"{}") for n in range(12)])
    _schedule(outboxkit_db_url, dict.fromkeys(ids, AT + 3600 * SECOND))
    store = ShardStore(SCHEMA)
    for shard in range(4):
        await store.schedule(conn, _term(outboxkit_db_url, shard), 100, now=AT)
    assert set(_states(outboxkit_db_url).values()) == {"scheduled"}
    set_shard_count(outboxkit_db_url, 1)
    settings = load_settings(overrides={"database": {"url": outboxkit_db_url}})
    housekeeping = Housekeeping(settings.relay, SCHEMA)
    await housekeeping.run_if_due(conn, _term(outboxkit_db_url), asyncio.Event(), now=AT)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        rows = c.execute(f"SELECT shard, state FROM {SCHEMA}.outbox_message").fetchall()
    assert {(int(shard) > 0, str(state)) for shard, state in rows} <= {
        (True, "parked"),
        (False, "scheduled"),
    }
    assert any(state == "parked" for _, state in rows)


@pytest.mark.parametrize("client", ["confluent", "aiokafka"])
async def test_the_relay_publishes_a_row_when_it_is_due(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Any,
    client: str,
) -> None:
    """End to end, by the database clock: the row waits in 'scheduled' while rows behind it
    are published, then goes out once due."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    [later] = insert_rows(outboxkit_db_url, topic, payloads("later", 1))
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(
            f"UPDATE {SCHEMA}.outbox_message SET deliver_after = now() + interval '4 seconds'"
            " WHERE id = %s",
            (later,),
        )
    insert_rows(outboxkit_db_url, topic, payloads("now", 2))
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, client=client)
    async with running_relay(settings):
        await wait_for_async(
            lambda: (
                states_by_key(outboxkit_db_url)
                == {"later": ["scheduled"], "now": ["published"] * 2}
            ),
            what="the rows due published, the later one scheduled",
        )
        await wait_for_async(
            lambda: states_by_key(outboxkit_db_url)["later"] == ["published"],
            what="the later row published once due",
        )
    got = consume(outboxkit_kafka_bootstrap, topic, expect=3)
    assert [r.key for r in got] == ["now", "now", "later"]
