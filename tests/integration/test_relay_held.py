"""Rows behind a parked row of their key wait in 'held', out of the claim's walk (migration 0009).

The claim tests every keyed row it walks for a parked row of its key: 100,000 rows behind one
parked key made each claim of the shard take about 26 ms instead of 2. The shard's holder moves
them to 'held' in its scheduling pass (``hold_rows``, fenced); a retry or discard of the parked
row brings them back to 'pending' in its own transaction (``held_release``), as does the
housekeeping that deletes it, with their ids, so they go before any newer row of their key.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from outboxkit import db
from outboxkit.relay.housekeeping import Housekeeping
from outboxkit.relay.reader import HOLD_WINDOW, ShardStore
from outboxkit.schema import parked_lock_name
from outboxkit.settings import load_settings
from tests.relay_support import SCHEMA, cli_ok, day_lease, insert_rows, payloads, set_shard_count
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

AT = datetime(2101, 1, 1, tzinfo=UTC)  # the tests' clock: far ahead of the database's
_LOCK = {"name": parked_lock_name(), "shard": 0}  # shard 0's parked_lock


@pytest.fixture
async def conn(outboxkit_db_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(outboxkit_db_url, autocommit=True) as c:
        yield c


def _park(url: str, row_id: int) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(
            f"UPDATE {SCHEMA}.outbox_message SET state = 'parked', parked_reason = 'test',"
            " parked_at = now() WHERE id = %s",
            (row_id,),
        )


def _states(url: str) -> dict[int, str]:
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(f"SELECT id, state FROM {SCHEMA}.outbox_message ORDER BY id").fetchall()
    return {int(i): str(s) for i, s in rows}


async def _claimed(store: ShardStore, conn: psycopg.AsyncConnection[Any]) -> list[int]:
    return [r.id for r in await store.claim(conn, 0, 100)]


async def _pass(
    url: str, conn: psycopg.AsyncConnection[Any], store: ShardStore | None = None
) -> tuple[int, int]:
    """One statement pair of shard 0's pass: rows moved to 'held', rows released."""
    moves = await (store or ShardStore(SCHEMA)).schedule(
        conn, day_lease(url, 0, AT), 100, 5.0, now=AT
    )
    return moves.held, moves.released


@pytest.fixture
def keyed(outboxkit_db_url: str) -> tuple[int, list[int], list[int]]:
    """One shard; a parked row of key "k", three rows of "k" behind it, two of "o"."""
    set_shard_count(outboxkit_db_url, 1)
    parked, *behind = insert_rows(outboxkit_db_url, "t", payloads("k", 4))
    others = insert_rows(outboxkit_db_url, "t", payloads("o", 2))
    _park(outboxkit_db_url, parked)
    return parked, behind, others


@pytest.mark.parametrize(
    ("action", "parked_ends"), [("retry", "pending"), ("discard", "discarded")]
)
async def test_held_behind_a_parked_row_and_back_in_order_with_its_retry_or_discard(
    outboxkit_db_url: str,
    conn: psycopg.AsyncConnection[Any],
    keyed: tuple[int, list[int], list[int]],
    action: str,
    parked_ends: str,
) -> None:
    parked, behind, others = keyed
    store = ShardStore(SCHEMA)
    assert await _pass(outboxkit_db_url, conn) == (3, 0)
    assert await _pass(outboxkit_db_url, conn) == (0, 0)  # nothing left to move
    states = _states(outboxkit_db_url)
    assert [states[i] for i in behind] == ["held"] * 3
    assert await _claimed(store, conn) == others
    newer = insert_rows(outboxkit_db_url, "t", payloads("k", 1, start=4))  # written meanwhile
    cli_ok(outboxkit_db_url, "outbox", action, str(parked))
    states = _states(outboxkit_db_url)
    assert states[parked] == parked_ends
    assert [states[i] for i in behind + newer] == ["pending"] * 4
    first = [parked] if parked_ends == "pending" else []
    assert await _claimed(store, conn) == sorted(first + behind + others + newer)


async def test_held_rows_whose_parked_row_went_by_hand_come_back_with_the_next_pass(
    outboxkit_db_url: str,
    conn: psycopg.AsyncConnection[Any],
    keyed: tuple[int, list[int], list[int]],
) -> None:
    parked, behind, _ = keyed
    await _pass(outboxkit_db_url, conn)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(f"DELETE FROM {SCHEMA}.outbox_message WHERE id = %s", (parked,))
    assert await _pass(outboxkit_db_url, conn) == (0, 3)
    assert {_states(outboxkit_db_url)[i] for i in behind} == {"pending"}


async def test_nothing_is_held_with_the_skip_policy_and_held_rows_come_back(
    outboxkit_db_url: str,
    conn: psycopg.AsyncConnection[Any],
    keyed: tuple[int, list[int], list[int]],
) -> None:
    """Rows of a parked key flow with policy 'skip': none is held, and rows held under 'wait'
    (the policy changed since) come back."""
    _, behind, _ = keyed
    await _pass(outboxkit_db_url, conn)
    assert await _pass(outboxkit_db_url, conn, ShardStore(SCHEMA, skip_parked_keys=True)) == (0, 3)
    assert {_states(outboxkit_db_url)[i] for i in behind} == {"pending"}
    assert await _pass(outboxkit_db_url, conn, ShardStore(SCHEMA, skip_parked_keys=True)) == (0, 0)


async def test_housekeeping_that_deletes_the_parked_row_releases_its_held_rows_with_it(
    outboxkit_db_url: str,
    conn: psycopg.AsyncConnection[Any],
    keyed: tuple[int, list[int], list[int]],
) -> None:
    parked, behind, _ = keyed
    await _pass(outboxkit_db_url, conn)
    settings = load_settings(
        overrides={
            "database": {"url": outboxkit_db_url},
            "relay": {"parked_retention_seconds": 60},
        }
    )
    housekeeping = Housekeeping(settings.relay, SCHEMA)
    await housekeeping.run_if_due(conn, day_lease(outboxkit_db_url, 0, AT), asyncio.Event(), now=AT)
    states = _states(outboxkit_db_url)
    assert parked not in states
    assert {states[i] for i in behind} == {"pending"}


async def test_only_the_front_of_the_walk_is_read_and_the_rest_follows_pass_by_pass(
    outboxkit_db_url: str, conn: psycopg.AsyncConnection[Any]
) -> None:
    """A pass reads the first HOLD_WINDOW pending rows: rows of the parked key beyond them are
    held by later passes, once the rows in front are gone."""
    set_shard_count(outboxkit_db_url, 1)
    parked = insert_rows(outboxkit_db_url, "t", payloads("k", 1))[0]
    _park(outboxkit_db_url, parked)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        insert_rows(c, "t", [(f"x{n}", b"{}") for n in range(HOLD_WINDOW)])
    late = insert_rows(outboxkit_db_url, "t", payloads("k", 2, start=1))
    assert await _pass(outboxkit_db_url, conn) == (0, 0)  # beyond the window
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(
            f"UPDATE {SCHEMA}.outbox_message SET state = 'published' WHERE message_key LIKE 'x%%'"
        )
    assert await _pass(outboxkit_db_url, conn) == (2, 0)
    assert {_states(outboxkit_db_url)[i] for i in late} == {"held"}


def test_a_retry_that_waited_for_a_pass_releases_what_the_pass_held(
    outboxkit_db_url: str, keyed: tuple[int, list[int], list[int]]
) -> None:
    """A retry meanwhile waits for the pass's transaction (parked_lock), and its release, a
    statement after the lock, sees the rows the pass held."""
    parked, behind, _ = keyed
    term = day_lease(outboxkit_db_url, 0, AT)
    skip = {"shard": 0, "skip_parked_keys": False}
    params = {**term.sql_params(AT), **skip, "limit": 100, "window": HOLD_WINDOW}
    with psycopg.connect(outboxkit_db_url) as passing:
        db.rows(passing, db.query("relay", "parked_lock", SCHEMA), _LOCK)
        db.rows(passing, db.query("relay", "hold_rows", SCHEMA), params)  # not committed yet
        retry = _waiting_command(outboxkit_db_url, "retry", parked)
        passing.commit()
    retry.join(30)
    states = _states(outboxkit_db_url)
    assert [states[i] for i in [parked, *behind]] == ["pending"] * 4


async def test_a_pass_during_a_retry_moves_no_held_row_and_the_claims_go_on(
    outboxkit_db_url: str,
    conn: psycopg.AsyncConnection[Any],
    keyed: tuple[int, list[int], list[int]],
) -> None:
    """The other order: a retry not committed yet when the pass comes. The pass does not wait
    for the shard's lock (the claims after it would wait with it): it moves no held row, and
    the next pass finds the retry's rows released, nothing to hold, and no newer row of the key
    before them."""
    parked, behind, others = keyed
    await _pass(outboxkit_db_url, conn)  # behind: held
    with psycopg.connect(outboxkit_db_url) as retrying:
        db.rows(retrying, db.query("relay", "parked_lock", SCHEMA), _LOCK)
        db.rows(
            retrying,
            db.query("relay", "parked_retry", SCHEMA),
            {"ids": [parked], "all": False, "shards": [0]},
        )
        db.rows(retrying, db.query("relay", "held_release", SCHEMA), {"shards": [0]})
        assert await asyncio.wait_for(_pass(outboxkit_db_url, conn), 30) == (0, 0)
        retrying.commit()
    assert await _pass(outboxkit_db_url, conn) == (0, 0)
    newer = insert_rows(outboxkit_db_url, "t", payloads("k", 1, start=4))
    states = _states(outboxkit_db_url)
    assert [states[i] for i in [parked, *behind, *newer]] == ["pending"] * 5
    store = ShardStore(SCHEMA)
    assert await _claimed(store, conn) == sorted([parked, *behind, *others, *newer])


def _waiting_command(url: str, action: str, row_id: int) -> threading.Thread:
    """``outbox <action> <row_id>`` started in a thread, once it waits for a lock."""
    command = threading.Thread(target=cli_ok, args=(url, "outbox", action, str(row_id)))
    command.start()
    wait_for(lambda: _waiting_for_a_lock(url), what=f"outbox {action} waiting")
    return command


def _waiting_for_a_lock(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        ).fetchone()
    return bool(row and row[0])


def test_two_operators_at_once_release_the_rows_held_behind_both_parked_rows(
    outboxkit_db_url: str, keyed: tuple[int, list[int], list[int]]
) -> None:
    """Two parked rows of one key, one retried and one discarded at the same moment: the second
    waits for the first (parked_lock), then sees that no parked row of the key is left. (Each
    would otherwise still see the other's row parked, and release nothing.)"""
    parked, behind, _ = keyed
    second, held = behind[0], behind[1:]
    _park(outboxkit_db_url, second)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        c.execute(f"UPDATE {SCHEMA}.outbox_message SET state = 'held' WHERE id = ANY(%s)", (held,))
    with psycopg.connect(outboxkit_db_url) as first:
        db.rows(first, db.query("relay", "parked_lock", SCHEMA), _LOCK)
        db.rows(
            first,
            db.query("relay", "parked_retry", SCHEMA),
            {"ids": [parked], "all": False, "shards": [0]},
        )
        db.rows(first, db.query("relay", "held_release", SCHEMA), {"shards": [0]})
        other = _waiting_command(outboxkit_db_url, "discard", second)
        first.commit()
    other.join(30)
    states = _states(outboxkit_db_url)
    ended = [states[i] for i in [parked, second, *held]]
    assert ended == ["pending", "discarded", "pending", "pending"]


def test_a_row_parked_in_another_shard_while_a_retry_waits_is_left_for_the_next_one(
    outboxkit_db_url: str,
) -> None:
    """``outbox retry --all`` locks the shards it found parked rows in, and changes rows of
    those shards only: a row parked meanwhile in another shard, whose lock it does not hold
    (that shard's pass may be holding rows behind it), stays parked with its held rows."""
    set_shard_count(outboxkit_db_url, 2)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
        first = insert_rows(c, "t", payloads("a", 1))[0]
        later, behind = insert_rows(c, "t", payloads("b", 2))
        c.execute(f"UPDATE {SCHEMA}.outbox_message SET shard = 0 WHERE id = %s", (first,))
        c.execute(
            f"UPDATE {SCHEMA}.outbox_message SET shard = 1 WHERE id = ANY(%s)", ([later, behind],)
        )
    _park(outboxkit_db_url, first)
    with psycopg.connect(outboxkit_db_url) as passing:  # shard 0's lock, taken by a pass
        db.rows(passing, db.query("relay", "parked_lock", SCHEMA), _LOCK)
        retry = threading.Thread(target=cli_ok, args=(outboxkit_db_url, "outbox", "retry", "--all"))
        retry.start()
        wait_for(lambda: _waiting_for_a_lock(outboxkit_db_url), what="the retry waiting")
        _park(outboxkit_db_url, later)
        with psycopg.connect(outboxkit_db_url, autocommit=True) as c:
            c.execute(f"UPDATE {SCHEMA}.outbox_message SET state = 'held' WHERE id = %s", (behind,))
        passing.commit()
    retry.join(30)
    states = _states(outboxkit_db_url)
    assert [states[i] for i in (first, later, behind)] == ["pending", "parked", "held"]
