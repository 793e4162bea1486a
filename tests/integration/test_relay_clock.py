"""The relay's claim and fenced writes judge time by the ``now`` a test passes (production passes
None: the database clock), so a test acts at a fixed time instead of waiting for one.

Each case is run at a fixed time long past and one far ahead of the database clock: a statement
that still read the database clock gets one of the two wrong.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import sql

from outboxkit import db
from outboxkit.errors import LeaseLostError
from outboxkit.relay.housekeeping import Housekeeping
from outboxkit.relay.lease import LeaseStore, LeaseTerm
from outboxkit.relay.lease_loss import LeaseLoss
from outboxkit.relay.reader import ShardStore
from outboxkit.settings import load_settings
from tests.relay_support import SCHEMA, insert_rows, payloads, row_states, set_shard_count

pytestmark = pytest.mark.integration

PAST = datetime(2001, 1, 1, tzinfo=UTC)
FUTURE = datetime(2101, 1, 1, tzinfo=UTC)
TIMES = pytest.mark.parametrize("at", [PAST, FUTURE], ids=["past", "future"])
SECOND = timedelta(seconds=1)
TTL = 30


@TIMES
@pytest.mark.parametrize("column", ["deliver_after", "next_attempt_at"])
async def test_a_row_is_claimed_once_the_given_now_reaches_its_due_time(
    outboxkit_db_url: str, at: datetime, column: str
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    [row_id] = insert_rows(outboxkit_db_url, "t", payloads("k", 1))
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(
            sql.SQL("UPDATE {}.outbox_message SET {} = %s WHERE id = %s").format(
                sql.Identifier(SCHEMA), sql.Identifier(column)
            ),
            (at, row_id),
        )
    store = ShardStore(SCHEMA)
    async with await db.connect_async(outboxkit_db_url) as conn:
        assert await store.claim(conn, 0, 10, now=at - SECOND) == []
        assert [r.id for r in await store.claim(conn, 0, 10, now=at + SECOND)] == [row_id]
        # No now: the database clock, as before.
        assert [r.id for r in await store.claim(conn, 0, 10)] == ([row_id] if at == PAST else [])


@TIMES
async def test_a_fenced_write_is_refused_once_the_given_now_passes_the_lease_expiry(
    outboxkit_db_url: str, at: datetime
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    first, second = insert_rows(outboxkit_db_url, "t", payloads("k", 2))
    store = ShardStore(SCHEMA)
    async with await db.connect_async(outboxkit_db_url) as conn:
        term = await _lease_at(conn, at)
        expires = at + timedelta(seconds=TTL)
        assert await store.mark_published(conn, term, [first], delete=False, now=expires - SECOND)
        with pytest.raises(LeaseLostError, match=r"expired by the database clock 1\.0s ago"):
            await store.mark_published(conn, term, [second], delete=False, now=expires + SECOND)
    assert term.lost_cause is LeaseLoss.EXPIRED
    assert row_states(outboxkit_db_url) == {"published": 1, "pending": 1}


Write = Callable[[ShardStore, psycopg.AsyncConnection[object], LeaseTerm, datetime], Awaitable[int]]
WRITES: dict[str, Write] = {
    "mark_published": lambda s, c, t, now: s.mark_published(c, t, [1], delete=False, now=now),
    "delete_published": lambda s, c, t, now: s.mark_published(c, t, [1], delete=True, now=now),
    "reconcile_published": lambda s, c, t, now: s.reconcile(
        c, t, [(1, str(uuid.uuid4()))], delete=False, now=now
    ),
    "reconcile_deleted": lambda s, c, t, now: s.reconcile(
        c, t, [(1, str(uuid.uuid4()))], delete=True, now=now
    ),
    "park": lambda s, c, t, now: s.park(c, t, 1, "x", now=now),
    "record_failure": lambda s, c, t, now: s.record_failure(c, t, [1], "x", now=now),
    "retention_delete": lambda s, c, t, now: s.retention(c, t, 0, 10, now=now),
}


@pytest.mark.parametrize("name", WRITES)
async def test_every_fenced_write_checks_the_lease_by_the_given_now(
    outboxkit_db_url: str, name: str
) -> None:
    """A lease acquired far ahead of the database clock: unexpired by that clock, expired by the
    given now. Every write names itself in the reason and changes nothing."""
    set_shard_count(outboxkit_db_url, 1)
    insert_rows(outboxkit_db_url, "t", payloads("k", 1))
    async with await db.connect_async(outboxkit_db_url) as conn:
        term = await _lease_at(conn, FUTURE)
        later = FUTURE + timedelta(seconds=TTL) + SECOND
        with pytest.raises(LeaseLostError, match=f"during {name}: expired by the database"):
            await WRITES[name](ShardStore(SCHEMA), conn, term, later)
    assert term.lost_cause is LeaseLoss.EXPIRED
    assert row_states(outboxkit_db_url) == {"pending": 1}


@pytest.mark.parametrize("shard", [0, 1], ids=["strays", "sweep"])
async def test_housekeeping_checks_the_lease_by_the_given_now(
    outboxkit_db_url: str, shard: int
) -> None:
    """Housekeeping with a lease expired by the given now: refused and told as expired, nothing
    changed. Shard 0's starts by parking rows of no shard (here one, which a check by the
    database clock would park); shard 1's is its sweep's delete alone."""
    set_shard_count(outboxkit_db_url, 2)
    insert_rows(outboxkit_db_url, "t", payloads("k", 1))
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(sql.SQL("UPDATE {}.outbox_message SET shard = 5").format(sql.Identifier(SCHEMA)))
    relay = {"discarded_retention_seconds": 3600}
    settings = load_settings(overrides={"database": {"url": outboxkit_db_url}, "relay": relay})
    async with await db.connect_async(outboxkit_db_url) as conn:
        term = await _lease_at(conn, FUTURE, shard)
        later = FUTURE + timedelta(seconds=TTL) + SECOND
        with pytest.raises(LeaseLostError, match="during housekeeping: expired by the database"):
            await Housekeeping(settings.relay, SCHEMA).run_if_due(
                conn, term, asyncio.Event(), now=later
            )
    assert term.lost_cause is LeaseLoss.EXPIRED
    assert row_states(outboxkit_db_url) == {"pending": 1}


async def _lease_at(
    conn: psycopg.AsyncConnection[object], at: datetime, shard: int = 0
) -> LeaseTerm:
    """The shard's lease, acquired at ``at``; this process has stopped trusting it (as it would
    have by the time it expires), so an expiry is told as one, not as disagreeing clocks."""
    term = await LeaseStore(SCHEMA).acquire(conn, "default", shard, "A", TTL, now=at)
    assert term is not None
    term.trusted_until = term.clock() - 1
    return term
