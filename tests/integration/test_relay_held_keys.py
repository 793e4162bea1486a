"""A shard's held rows of many keys: the pass walks their keys a bounded step at a time.

Held rows are walked by key (``outbox_message_held_idx``) to find the keys no parked row holds
back any more. One walk of every key each pass made each pass cost O(keys), and letting them
go 1,000 rows a statement walked every key left at each statement: O(keys²). Measured: 20,000
keys let go in 3.8 s, 100,000 in 97.9 s, the shard publishing nothing meanwhile. Counted here
as index scans of the held rows' index, which the server counts exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

import psycopg
import pytest

from outboxkit.errors import LeaseLostError
from outboxkit.relay.lease_loss import LeaseLoss
from outboxkit.relay.reader import ShardStore
from outboxkit.relay.scheduling import PASS_SECONDS, Scheduling
from tests.relay_support import SCHEMA, day_lease, insert_rows, payloads, set_shard_count

pytestmark = pytest.mark.integration

AT = datetime(2101, 1, 1, tzinfo=UTC)  # the tests' clock: far ahead of the database's
KEYS = 20_000


@pytest.fixture
async def conn(outboxkit_db_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(outboxkit_db_url, autocommit=True) as c:
        yield c


def _fill(url: str, *, parked: bool) -> None:
    """Shard 0 of 1: KEYS keys with two held rows each (and a parked row each if ``parked``),
    in one statement each (the writer would take minutes)."""
    set_shard_count(url, 1)
    columns = "event_id, idempotency_key, content_digest, topic, message_key, payload, state"
    with psycopg.connect(url, autocommit=True) as c:
        if parked:
            c.execute(
                f"INSERT INTO {SCHEMA}.outbox_message ({columns}, parked_at, parked_reason)"
                " SELECT gen_random_uuid(), 'p' || n, '\\x00', 't', 'key-' || n, '\\x7b7d',"
                " 'parked', now(), 'test' FROM generate_series(1, %s) n",
                (KEYS,),
            )
        c.execute(
            f"INSERT INTO {SCHEMA}.outbox_message ({columns})"
            " SELECT gen_random_uuid(), 'h' || n || '.' || r, '\\x00', 't', 'key-' || n,"
            " '\\x7b7d', 'held' FROM generate_series(1, %s) n, generate_series(1, 2) r"
            " ORDER BY r, n",
            (KEYS,),
        )
        c.execute(f"ANALYZE {SCHEMA}.outbox_message")


async def _held_index_scans(conn: psycopg.AsyncConnection[Any]) -> int:
    """Index scans of the held rows' index so far, this session's own ones included."""
    await conn.execute("SELECT pg_stat_force_next_flush()")  # flushed as the session idles
    cur = await conn.execute(
        "SELECT idx_scan FROM pg_stat_user_indexes"
        " WHERE schemaname = %s AND indexrelname = 'outbox_message_held_idx'",
        (SCHEMA,),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def _states(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(
            f"SELECT state, count(*) FROM {SCHEMA}.outbox_message GROUP BY state"
        ).fetchall()
    return {str(s): int(n) for s, n in rows}


async def _run_pass(url: str, conn: psycopg.AsyncConnection[Any], store: ShardStore) -> None:
    scheduling = Scheduling(1.0)
    await scheduling.run_if_due(conn, day_lease(url, 0, AT), store, asyncio.Event(), now=AT)


@pytest.mark.parametrize("skip", [False, True], ids=["parked-rows-gone", "policy-skip"])
async def test_letting_many_held_keys_go_walks_each_key_about_once(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any], skip: bool
) -> None:
    """Every held row comes back in one pass, before the next claim, reading the held rows'
    index about once a key (the rows of a key go in id order: they keep their ids)."""
    _fill(outboxkit_db_url, parked=False)  # as if the parked rows went by hand
    before = await _held_index_scans(conn)
    await _run_pass(outboxkit_db_url, conn, ShardStore(SCHEMA, skip_parked_keys=skip))
    scans = await _held_index_scans(conn) - before
    assert _states(outboxkit_db_url) == {"pending": 2 * KEYS}
    assert scans <= 3 * KEYS, f"{scans} index scans to let {KEYS} keys go"


async def test_a_pass_walks_a_bounded_part_of_many_held_keys(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """Keys whose parked rows stay: a pass walks what its time allows, and the next ones go on
    from there; a key whose parked row went by hand is found within a few passes."""
    _fill(outboxkit_db_url, parked=True)
    store, term = ShardStore(SCHEMA), day_lease(outboxkit_db_url, 0, AT)
    scheduling = Scheduling(0.0, clock=_Ticks(PASS_SECONDS / 4))  # 4 statement pairs a pass
    before = await _held_index_scans(conn)
    await scheduling.run_if_due(conn, term, store, asyncio.Event(), now=AT)
    scans = await _held_index_scans(conn) - before
    assert scans <= 5 * 1000, f"{scans} index scans in a pass over {KEYS} held keys"
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:  # the last key's, by hand
        c.execute(f"DELETE FROM {SCHEMA}.outbox_message WHERE idempotency_key = %s", (f"p{KEYS}",))
    for _ in range(KEYS // (4 * 1000) + 1):
        await scheduling.run_if_due(conn, term, store, asyncio.Event(), now=AT)
        if _states(outboxkit_db_url).get("pending"):
            break
    assert _states(outboxkit_db_url) == {"parked": KEYS - 1, "held": 2 * KEYS - 2, "pending": 2}


class _Ticks:
    """A clock that moves ``step`` each time it is read after the pass began: the pass's time
    runs out after a known number of statements, whatever the machine's speed."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class _LostAfterOneStep:
    """A shard store whose term is lost after the first statement pair of a pass (a renewal
    that failed meanwhile): the pass stops there, in the middle of its walk of held keys."""

    def __init__(self, store: ShardStore) -> None:
        self.store = store

    async def schedule(self, conn: Any, term: Any, *args: Any, **kwargs: Any) -> Any:
        moves = await self.store.schedule(conn, term, *args, **kwargs)
        term.mark_lost("renewal failed (test)", LeaseLoss.TAKEN_OVER)
        return moves


async def test_under_skip_a_new_term_walks_every_held_key_whatever_the_last_term_left(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """A 'skip' holder loses its lease in the middle of its walk; a holder still under 'wait'
    (a rolling switch of the policy) holds rows of a key behind that place; back with the
    lease, the 'skip' holder's first pass lets them go too, before its first claim: newer
    rows of the key go after them."""
    set_shard_count(outboxkit_db_url, 1)
    columns = "event_id, idempotency_key, content_digest, topic, message_key, payload, state"
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(
            f"INSERT INTO {SCHEMA}.outbox_message ({columns})"
            " SELECT gen_random_uuid(), 'h' || n, '\\x00', 't', 'key-' || lpad(n::text, 4, '0'),"
            " '\\x7b7d', 'held' FROM generate_series(0, 2499) n"
        )
    skipping = ShardStore(SCHEMA, skip_parked_keys=True)
    lost = _LostAfterOneStep(skipping)
    with pytest.raises(LeaseLostError):
        await Scheduling(1.0).run_if_due(
            conn, day_lease(outboxkit_db_url, 0, AT), cast(Any, lost), asyncio.Event(), now=AT
        )
    assert _states(outboxkit_db_url) == {"pending": 1000, "held": 1500}  # walked to key-0999
    parked, *behind = insert_rows(outboxkit_db_url, "t", payloads("key-0005a", 3))
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(
            f"UPDATE {SCHEMA}.outbox_message SET state = 'parked', parked_reason = 'test',"
            " parked_at = now() WHERE id = %s",
            (parked,),
        )
    waiting = ShardStore(SCHEMA)  # the other holder, still under 'wait'
    moves = await waiting.schedule(conn, day_lease(outboxkit_db_url, 0, AT), 1000, 5.0, now=AT)
    assert moves.held == len(behind)
    newer = insert_rows(outboxkit_db_url, "t", payloads("key-0005a", 1, start=3))
    term = day_lease(outboxkit_db_url, 0, AT)  # the 'skip' holder's again
    await Scheduling(1.0).run_if_due(conn, term, skipping, asyncio.Event(), now=AT)
    assert "held" not in _states(outboxkit_db_url)
    claimed = [r.id for r in await skipping.claim(conn, 0, 5000, now=AT)]
    assert [i for i in claimed if i in behind + newer] == behind + newer


class _Recorded:
    """A shard store whose schedule() statement pairs' moves are kept."""

    def __init__(self, store: ShardStore) -> None:
        self.store, self.moves = store, list[Any]()

    async def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self.moves.append(await self.store.schedule(*args, **kwargs))
        return self.moves[-1]


@pytest.mark.parametrize("skip", [False, True], ids=["parked-row-gone", "policy-skip"])
async def test_one_key_with_many_held_rows_goes_back_in_bounded_statements(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any], skip: bool
) -> None:
    """A key held for hours under load may have millions of rows: one statement for them all
    holds the lease row for longer than a lease lasts. Each statement lets at most ten rows a
    key of its step go (here 10 x 20), oldest first, and the pass goes on until all are back,
    before the next claim."""
    set_shard_count(outboxkit_db_url, 1)
    columns = "event_id, idempotency_key, content_digest, topic, message_key, payload, state"
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(
            f"INSERT INTO {SCHEMA}.outbox_message ({columns})"
            " SELECT gen_random_uuid(), 'h' || n, '\\x00', 't', 'hot', '\\x7b7d', 'held'"
            " FROM generate_series(1, 1000) n"
        )
    newer = insert_rows(outboxkit_db_url, "t", payloads("hot", 1))
    recorded = _Recorded(ShardStore(SCHEMA, skip_parked_keys=skip))
    scheduling = Scheduling(1.0, batch=20)
    await scheduling.run_if_due(
        conn, day_lease(outboxkit_db_url, 0, AT), cast(Any, recorded), asyncio.Event(), now=AT
    )
    assert _states(outboxkit_db_url) == {"pending": 1001}
    released = [m.released for m in recorded.moves]
    assert sum(released) == 1000, released
    assert max(released) <= 200, released
    claimed = [r.id for r in await recorded.store.claim(conn, 0, 5000, now=AT)]
    assert claimed[-1:] == newer  # the held rows first, in order
    assert claimed == sorted(claimed)
