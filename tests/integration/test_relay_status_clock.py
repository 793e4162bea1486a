"""The operator read-outs (``relay status``, the sampler's holders and gauges) judge time by the
``now`` a test passes (production passes None: the database clock): whether a lease is active,
and the oldest pending row's age.

Each case is run at a fixed time long past and one far ahead of the database clock: a statement
that still read the database clock gets one of the two wrong.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from outboxkit import db
from outboxkit.relay import status_sampler
from outboxkit.relay.lease import LeaseStore
from outboxkit.relay.metrics import RelayMetrics
from tests.integration.test_relay_clock import SECOND, TIMES, TTL
from tests.relay_support import SCHEMA, insert_rows, payloads, set_shard_count

pytestmark = pytest.mark.integration

AGE = 90.0


async def _read(conn: psycopg.AsyncConnection[Any], name: str, now: datetime) -> list[Any]:
    """Shard 0's row of ``name`` (holders or status) for relay process "other"."""
    params: dict[str, Any] = {"group": "default", "holder": "other", "now": now}
    if name == "status":
        params["only"] = None
    [row] = await db.rows_async(conn, db.query("relay", name, SCHEMA), params)
    return list(row)


def _pending_since(url: str, at: datetime) -> None:
    """One pending row of shard 0, written at ``at``."""
    [row_id] = insert_rows(url, "t", payloads("k", 1))
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"UPDATE {SCHEMA}.outbox_message SET created_at = %s WHERE id = %s", (at, row_id))


@TIMES
@pytest.mark.parametrize("name", ["holders", "status"])
async def test_a_lease_is_active_until_the_given_now_passes_its_expiry(
    outboxkit_db_url: str, at: datetime, name: str
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    async with await db.connect_async(outboxkit_db_url) as conn:
        assert await LeaseStore(SCHEMA).acquire(conn, "default", 0, "me", TTL, now=at)
        expires = at + timedelta(seconds=TTL)
        before = await _read(conn, name, expires - SECOND)
        after = await _read(conn, name, expires + SECOND)
    active, counts = (1, 3) if name == "holders" else (4, 8)
    # Held by "me": "other" does not count it; expired, every process does.
    assert (before[active], before[counts]) == (True, False)
    assert (after[active], after[counts]) == (False, True)


@TIMES
async def test_the_oldest_pending_age_is_counted_from_the_given_now(
    outboxkit_db_url: str, at: datetime
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    _pending_since(outboxkit_db_url, at)
    async with await db.connect_async(outboxkit_db_url) as conn:
        row = await _read(conn, "status", at + timedelta(seconds=AGE))
    assert (row[5], float(row[6])) == (1, AGE)


@TIMES
async def test_a_row_scheduled_for_later_is_as_old_as_it_has_been_due(
    outboxkit_db_url: str, at: datetime
) -> None:
    """A row written at ``at`` for a day later: 0 until it is due (it is back in ``pending``
    some seconds before, see scheduling), then its age runs from then, not from ``at``."""
    set_shard_count(outboxkit_db_url, 1)
    _pending_since(outboxkit_db_url, at)
    due = at + timedelta(days=1)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(f"UPDATE {SCHEMA}.outbox_message SET deliver_after = %s", (due,))
    async with await db.connect_async(outboxkit_db_url) as conn:
        early = await _read(conn, "status", due - 5 * SECOND)
        late = await _read(conn, "status", due + timedelta(seconds=AGE))
    assert (early[5], float(early[6])) == (1, 0.0)
    assert (late[5], float(late[6])) == (1, AGE)


async def test_a_shard_with_nothing_pending_has_no_oldest_age(outboxkit_db_url: str) -> None:
    """No pending row: no age (``relay status`` shows ``-``, its JSON null), not 0 (the clamp
    at 0 must not turn the minimum of no rows into an age)."""
    set_shard_count(outboxkit_db_url, 1)
    async with await db.connect_async(outboxkit_db_url) as conn:
        row = await _read(conn, "status", datetime.now(UTC))
    assert (row[5], row[6], row[9]) == (0, None, True)  # walked, nothing pending


@TIMES
async def test_the_sampler_passes_its_now_to_the_gauges(
    outboxkit_db_url: str, at: datetime, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    _pending_since(outboxkit_db_url, at)
    async with await db.connect_async(outboxkit_db_url) as conn:
        assert await LeaseStore(SCHEMA).acquire(conn, "default", 0, "me", TTL, now=at)
    reads: asyncio.Queue[str] = asyncio.Queue()  # the statements read, in order: the signal
    real_rows = db.rows_async

    async def recorded(conn: Any, query: db.Query, params: Any = None) -> Sequence[Any]:
        found = await real_rows(conn, query, params)
        reads.put_nowait(query.name)
        return found

    monkeypatch.setattr(db, "rows_async", recorded)  # what the sampler calls
    metrics, stop = RelayMetrics(), asyncio.Event()
    now = at + timedelta(seconds=AGE)  # past the lease's expiry
    task = asyncio.create_task(
        status_sampler.sample_forever(
            outboxkit_db_url, SCHEMA, "default", "me", metrics, stop, every=0.01, now=now
        )
    )
    try:
        async with asyncio.timeout(30):
            while await reads.get() != "status":
                pass
            await reads.get()  # the read after the count: its gauges are set
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert metrics.group_active.labels("0")._value.get() == 0
    assert metrics.oldest_pending.labels("0")._value.get() == AGE
