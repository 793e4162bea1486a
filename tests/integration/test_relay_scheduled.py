"""Rows scheduled for later wait in 'scheduled', out of the claim's walk, and come back shortly
before they are due.

Every claim walks its shard's pending rows in id order; 300,000 rows scheduled for the next day
below the due ones made each claim of their shard about 100 ms instead of 2 (benchmarks/
relay_scheduled.py). The shard's holder now moves them out (``schedule_rows``, fenced) and back
ahead of their time, with their ids: the claim's own test of ``deliver_after`` then lets each go
when due, in its place among its key's due rows.
"""

from __future__ import annotations

import asyncio
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
    day_lease,
    insert_rows,
    payloads,
    pending_count,
    relay_settings,
    running_relay,
    set_shard_count,
    states_by_key,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

AT = datetime(2101, 1, 1, tzinfo=UTC)  # the tests' clock: far ahead of the database's
SECOND = timedelta(seconds=1)


def _term(url: str, shard: int = 0) -> LeaseTerm:
    return day_lease(url, shard, AT)


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


async def test_rows_wait_out_of_the_claim_and_come_back_ahead_of_their_time(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    first, second, plain, third = insert_rows(outboxkit_db_url, "t", payloads("k", 4))
    _schedule(
        outboxkit_db_url, {first: AT + 20 * SECOND, second: AT + 10 * SECOND, third: AT + SECOND}
    )
    store, term = ShardStore(SCHEMA), _term(outboxkit_db_url)
    # Due within the 5 s ahead: third stays pending (the claim's own test holds it back).
    assert (await store.schedule(conn, term, 10, 5.0, now=AT))[:2] == (2, 0)
    states = _states(outboxkit_db_url)
    assert [states[i] for i in (first, second, plain, third)] == [
        "scheduled",
        "scheduled",
        "pending",
        "pending",
    ]
    assert [r.id for r in await store.claim(conn, 0, 10, now=AT)] == [plain]
    assert [r.id for r in await store.claim(conn, 0, 10, now=AT + SECOND)] == [plain, third]
    # A claim passes scheduled rows by, even at a clock past their time: the pass brings them
    # back before they are due, so that does not happen while passes keep their pace.
    assert [r.id for r in await store.claim(conn, 0, 10, now=AT + 30 * SECOND)] == [plain, third]
    assert (await store.schedule(conn, term, 10, 5.0, now=AT + 6 * SECOND))[:2] == (0, 1)
    assert [r.id for r in await store.claim(conn, 0, 10, now=AT + 9 * SECOND)] == [plain, third]
    assert [r.id for r in await store.claim(conn, 0, 10, now=AT + 10 * SECOND)] == [
        second,  # due: before the newer rows of its key, in id order
        plain,
        third,
    ]


async def test_a_row_due_between_passes_keeps_its_place_among_its_keys_due_rows(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """Brought back only once due, a scheduled row would let a newer row of its key that was
    due first go before it, up to a pass interval after its time (found by review)."""
    set_shard_count(outboxkit_db_url, 1)
    [early] = insert_rows(outboxkit_db_url, "t", payloads("k", 1))
    _schedule(outboxkit_db_url, {early: AT + 10 * SECOND})
    store, term = ShardStore(SCHEMA), _term(outboxkit_db_url)
    assert (await store.schedule(conn, term, 10, 5.0, now=AT))[:2] == (1, 0)
    [newer] = insert_rows(outboxkit_db_url, "t", payloads("k", 1, start=1))
    assert (await store.schedule(conn, term, 10, 5.0, now=AT + 6 * SECOND))[:2] == (0, 1)
    assert [r.id for r in await store.claim(conn, 0, 10, now=AT + 6 * SECOND)] == [newer]
    found = await store.claim(conn, 0, 10, now=AT + 11 * SECOND)
    assert [r.id for r in found] == [early, newer]


async def test_moves_are_bounded_and_leave_rows_not_yet_due(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    ids = insert_rows(outboxkit_db_url, "t", payloads("k", 7))
    _schedule(outboxkit_db_url, {row_id: AT + n * SECOND for n, row_id in enumerate(ids)})
    store, term = ShardStore(SCHEMA), _term(outboxkit_db_url)
    assert (await store.schedule(conn, term, 3, 0.0, now=AT))[:2] == (3, 0)  # ids[0] is due at AT
    assert (await store.schedule(conn, term, 3, 0.0, now=AT))[:2] == (3, 0)
    assert (await store.schedule(conn, term, 3, 0.0, now=AT))[:2] == (0, 0)
    assert (await store.schedule(conn, term, 3, 0.0, now=AT + 4 * SECOND))[:2] == (0, 3)
    assert (await store.schedule(conn, term, 3, 0.0, now=AT + 4 * SECOND))[:2] == (0, 1)
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
    assert (await store.schedule(conn, term, 10, 5.0, now=AT))[:2] == (1, 0)
    _schedule(outboxkit_db_url, {row_id: None})
    assert (await store.schedule(conn, term, 10, 5.0, now=AT))[:2] == (0, 1)
    assert [r.id for r in await store.claim(conn, 0, 10, now=AT)] == [row_id]


async def test_moves_are_fenced(outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]) -> None:
    set_shard_count(outboxkit_db_url, 1)
    [row_id] = insert_rows(outboxkit_db_url, "t", payloads("k", 1))
    _schedule(outboxkit_db_url, {row_id: AT + SECOND})
    store, old = ShardStore(SCHEMA), _term(outboxkit_db_url)
    _term(outboxkit_db_url)  # a newer holder's token
    with pytest.raises(LeaseLostError):
        await store.schedule(conn, old, 10, 0.0, now=AT)
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
    params = {**term.sql_params(AT), "limit": 1000, "ahead_seconds": 5.0}
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
        await store.schedule(conn, _term(outboxkit_db_url, shard), 100, 5.0, now=AT)
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
async def test_the_relay_publishes_a_scheduled_row_once_it_is_due(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Any,
    client: str,
) -> None:
    """End to end, by the database clock: the row waits in 'scheduled' while the rows behind it
    are published, and goes out once made due."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    [later] = insert_rows(outboxkit_db_url, topic, payloads("later", 1))
    _schedule_in(outboxkit_db_url, later, "1 hour")
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
        _schedule_in(outboxkit_db_url, later, "2 seconds")  # brought back at the next pass
        await wait_for_async(
            lambda: states_by_key(outboxkit_db_url)["later"] == ["published"],
            what="the later row published once due",
        )
    got = consume(outboxkit_kafka_bootstrap, topic, expect=3)
    assert [r.key for r in got] == ["now", "now", "later"]


async def test_under_a_backlog_a_scheduled_row_goes_out_when_due(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: Any
) -> None:
    """Under a backlog every batch prefetches the next claim, and the moves ran only between
    unprefetched claims: a row due stayed 'scheduled' until the backlog was gone (found by
    review: 22 s late, behind 323,000 newer rows). A pass due now drops the prefetched claim."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    [later] = insert_rows(outboxkit_db_url, topic, payloads("later", 1))
    _schedule_in(outboxkit_db_url, later, "1 hour")
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(
            f"INSERT INTO {SCHEMA}.outbox_message (event_id, idempotency_key, content_digest,"
            " topic, message_key, payload, shard)"
            " SELECT gen_random_uuid(), 'b' || g, '\\x00', %s, 'now', '\\x7b7d', 0"
            " FROM generate_series(1, 20000) g",
            (topic,),
        )
    settings = relay_settings(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        client="confluent",
        batch_size=20,
        max_batch_size=20,
    )
    async with running_relay(settings):
        await wait_for_async(
            lambda: states_by_key(outboxkit_db_url)["later"] == ["scheduled"],
            what="the later row scheduled",
        )
        _schedule_in(outboxkit_db_url, later, "0 seconds")
        await wait_for_async(
            lambda: states_by_key(outboxkit_db_url)["later"] == ["published"],
            what="the later row published once due",
        )
        left = pending_count(outboxkit_db_url)
    assert left > 0  # it did not wait for the backlog


def _schedule_in(url: str, row_id: int, interval: str) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(
            f"UPDATE {SCHEMA}.outbox_message SET deliver_after = now() + %s::interval"
            " WHERE id = %s",
            (interval, row_id),
        )
