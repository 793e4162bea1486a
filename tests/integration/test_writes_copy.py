"""add_many's COPY path: same rows, shards, results and guarantees as the INSERT path."""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from outboxkit.errors import (
    IdempotencyKeyConflictError,
    InvalidTopicError,
    PayloadTooLargeError,
)
from outboxkit.events import Message
from outboxkit.outbox import Outbox, WriteResult
from outboxkit.outbox_copy import shard_of
from outboxkit.schema import notify_channel

pytestmark = pytest.mark.integration

COPYING = Outbox(copy_min_rows=10)
INSERTING = Outbox(copy_min_rows=None)


@pytest.fixture
def engine(sa_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(sa_url, pool_size=5)
    yield eng
    eng.dispose()


def batch(n: int, prefix: str, **options: Any) -> list[Message]:
    return [
        Message("t", {"n": i}, key=f"{prefix}-{i % 5}", idempotency_key=f"{prefix}-{i}", **options)
        for i in range(n)
    ]


def stored(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT id, event_id, idempotency_key, shard, payload, xact_id"
                    " FROM outboxkit.outbox_message ORDER BY id"
                )
            )
        )


def test_python_shard_equals_the_sql_function(engine: sa.Engine) -> None:
    keys: list[str | None] = [None, "", "a", "order-17", "ünïcødé ✓", "x" * 3000, "\t"]
    keys += [str(uuid.uuid4()) for _ in range(200)]
    ids = [uuid.uuid4() for _ in keys]
    with engine.connect() as conn:
        for count in (1, 2, 7, 1024):
            sql = conn.execute(
                sa.text(
                    "SELECT outboxkit.outbox_shard(k, e, :c) FROM unnest("
                    "CAST(:keys AS text[]), CAST(:ids AS uuid[])) WITH ORDINALITY AS t(k, e, o)"
                    " ORDER BY o"
                ),
                {"keys": keys, "ids": ids, "c": count},
            ).scalars()
            assert list(sql) == [shard_of(k, e, count) for k, e in zip(keys, ids, strict=True)]


def test_copy_writes_what_insert_writes(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outboxkit.outbox_setting SET shard_count = 4"))
    with engine.begin() as conn:
        copied = COPYING.add_many(conn, batch(50, "c"))
        inserted = INSERTING.add_many(conn, batch(50, "i"))
    found = stored(engine)
    assert [(r.id, r.event_id) for r in found] == [(w.id, w.event_id) for w in copied + inserted]
    by_key = {r.idempotency_key: r for r in found}
    for i in range(50):  # same key -> same shard on both paths, computed the same way
        assert by_key[f"c-{i}"].shard == shard_of(f"c-{i % 5}", by_key[f"c-{i}"].event_id, 4)
        assert by_key[f"i-{i}"].shard == shard_of(f"i-{i % 5}", by_key[f"i-{i}"].event_id, 4)
    assert len({r.xact_id for r in found}) == 1


def test_ids_follow_input_order_with_a_sequence_cache_and_other_sessions(
    engine: sa.Engine,
) -> None:
    """The COPY's ids are taken from the identity before it and sent with the rows. With a
    sequence cache, this session's ids can lie below another session's committed row: each row
    still has the id it was stored with, increasing in input order, and folded repeats take
    none."""

    def cache(size: int) -> None:
        with engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE outboxkit.outbox_message ALTER id SET CACHE {size}"))

    cache(50)
    try:
        with engine.connect() as mine, engine.connect() as other:
            [first] = INSERTING.add_many(mine, batch(1, "a"))  # takes a cache of 50 ids
            mine.commit()
            [theirs] = INSERTING.add_many(other, batch(1, "b"))  # the next 50: above ours
            other.commit()
            items = batch(30, "c")
            copied = COPYING.add_many(mine, items + items[:10])  # 10 repeats, folded
            mine.commit()
    finally:
        cache(1)
    assert first.id is not None
    assert theirs.id is not None
    ids = [w.id for w in copied]
    assert ids[:30] == list(range(first.id + 1, first.id + 31))  # below theirs: the cache
    assert [w.duplicate for w in copied] == [False] * 30 + [True] * 10  # folded, no row
    assert [w.event_id for w in copied[30:]] == [w.event_id for w in copied[:10]]
    by_event_id = {r.event_id: r.id for r in stored(engine)}
    assert len(by_event_id) == 2 + 30  # first, theirs and the copied rows
    assert [by_event_id[w.event_id] for w in copied[:30]] == ids[:30]


def test_taken_keys_fall_back_to_insert_with_the_same_answers(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        [earlier] = INSERTING.add_many(conn, batch(30, "k")[7:8])
    with engine.connect() as conn:
        INSERTING.add(conn, Message("t", b"mine"), idempotency_key="before")
        results = COPYING.add_many(conn, batch(30, "k"))  # k-7 exists, same content
        assert [r.duplicate for r in results] == [i == 7 for i in range(30)]
        assert results[7].event_id == earlier.event_id
        conflicting = batch(30, "z")
        conflicting[20] = Message("t", {"other": 1}, idempotency_key="k-3")
        with pytest.raises(IdempotencyKeyConflictError):
            COPYING.add_many(conn, conflicting)
        conn.commit()  # the transaction carried on: its own rows, none of the failed call's
    keys = [r.idempotency_key for r in stored(engine)]
    assert sorted(keys) == sorted(["before"] + [f"k-{i}" for i in range(30)])


def test_a_taken_event_id_fails_as_on_the_insert_path(engine: sa.Engine) -> None:
    event_id = uuid.uuid4()
    with engine.begin() as conn:
        INSERTING.add(conn, Message("t", b"1"), event_id=event_id)
    messages = batch(20, "e")
    messages[5] = Message("t", b"2", event_id=event_id, idempotency_key="another")
    with engine.connect() as conn, pytest.raises(sa.exc.IntegrityError, match="event_id"):
        COPYING.add_many(conn, messages)


def test_copy_notifies_each_shard_once_on_commit(engine: sa.Engine, outboxkit_db_url: str) -> None:
    channel = notify_channel("outboxkit")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outboxkit.outbox_setting SET shard_count = 3"))
    with psycopg.connect(outboxkit_db_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "{channel}"')
        with engine.begin() as conn:
            COPYING.add_many(conn, batch(40, "n"))
            COPYING.add_many(conn, batch(40, "m"))  # nothing new to notify
        shards = {r.shard for r in stored(engine)}
        got: list[str] = []
        end = time.monotonic() + 30
        while len(got) < len(shards) and time.monotonic() < end:
            got += [n.payload for n in listener.notifies(timeout=0.2, stop_after=None)]
        got += [n.payload for n in listener.notifies(timeout=0.5, stop_after=None)]
    assert sorted(got) == sorted(str(s) for s in shards)
    assert len(shards) > 1


def _copy_in_thread(
    engine: sa.Engine, items: list[Message]
) -> tuple[threading.Thread, list[list[WriteResult] | BaseException], list[int]]:
    """``add_many`` on the COPY path in a thread of its own (started): its results or its
    error land in the outcome list, its backend's pid in the pid list once it has one."""
    outcome: list[list[WriteResult] | BaseException] = []
    pids: list[int] = []

    def write() -> None:
        with engine.begin() as conn:
            pids.append(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
            try:
                outcome.append(COPYING.add_many(conn, items))
            except BaseException as exc:  # reported to the test thread
                outcome.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    return thread, outcome, pids


def _wait_until_blocked(engine: sa.Engine, pids: list[int]) -> None:
    end = time.monotonic() + 60
    with engine.connect() as probe:
        while time.monotonic() < end:
            waiting = (
                probe.execute(
                    sa.text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": pids[0]},
                ).scalar()
                if pids
                else None
            )
            probe.rollback()
            if waiting == "Lock":
                return
            time.sleep(0.02)
    raise AssertionError("the writer never waited for a lock")


def test_a_concurrent_holder_of_a_key_is_waited_for(engine: sa.Engine) -> None:
    """The COPY blocks on a key another transaction holds; once that one commits, the key is
    taken and the call falls back to ON CONFLICT: a duplicate, never a second row."""
    holder = engine.connect()
    [first] = INSERTING.add_many(holder, batch(15, "w")[9:10])
    thread, outcome, pids = _copy_in_thread(engine, batch(15, "w"))
    _wait_until_blocked(engine, pids)  # the COPY waits for the key's holder
    holder.commit()
    holder.close()
    thread.join(60)
    [results] = outcome
    assert isinstance(results, list)
    assert [r.duplicate for r in results] == [i == 9 for i in range(15)]
    assert results[9].event_id == first.event_id
    assert len(stored(engine)) == 15


def test_a_shard_switch_in_progress_is_waited_for_and_its_count_used(engine: sa.Engine) -> None:
    """`relay shards` locks the table (SHARE) and changes the count. A COPY that read the count
    before that switch committed, and wrote after, would shard its keys by the old count: one
    key's rows in two shards, publishing independently. The COPY path waits for the switch
    before it reads the count."""
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE outboxkit.outbox_setting SET shard_count = 1"))
    switch = engine.connect()  # what `relay shards 3` does, held open
    switch.execute(sa.text("LOCK TABLE outboxkit.outbox_message IN SHARE MODE"))
    switch.execute(sa.text("UPDATE outboxkit.outbox_setting SET shard_count = 3"))
    thread, outcome, pids = _copy_in_thread(engine, batch(15, "s"))
    try:
        _wait_until_blocked(engine, pids)
    finally:
        switch.commit()
        switch.close()
        thread.join(60)
    [results] = outcome
    assert isinstance(results, list)
    found = stored(engine)
    assert len(found) == 15
    assert {r.shard for r in found} != {0}  # the five keys do not all hash to shard 0 of 3
    for r in found:
        assert r.shard == shard_of(f"s-{int(r.idempotency_key[2:]) % 5}", r.event_id, 3)


async def test_async_copy(aengine: AsyncEngine) -> None:
    async with aengine.connect() as conn:
        results = await COPYING.add_many_async(conn, batch(25, "a"))
        again = await COPYING.add_many_async(conn, batch(25, "a"))
        assert [r.event_id for r in again] == [r.event_id for r in results]
        assert all(r.duplicate for r in again)
        other = batch(25, "b")
        other[3] = Message("t", {"x": 1}, idempotency_key="a-1")
        with pytest.raises(IdempotencyKeyConflictError):
            await COPYING.add_many_async(conn, other)
        await conn.commit()
        count = await conn.execute(sa.text("SELECT count(*) FROM outboxkit.outbox_message"))
        assert count.scalar_one() == 25
        found = await conn.execute(sa.text("SELECT event_id, id FROM outboxkit.outbox_message"))
        by_event_id: dict[uuid.UUID, int] = dict(list(found))
        assert [by_event_id[r.event_id] for r in results] == [r.id for r in results]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (Message("bad topic", b"x"), InvalidTopicError),
        (Message("t", b"x" * 1_000_001), PayloadTooLargeError),
        (Message("t", {"other": 1}, idempotency_key="s-3"), IdempotencyKeyConflictError),
    ],
)
def test_an_invalid_item_mid_stream_leaves_nothing_of_the_call(
    engine: sa.Engine, bad: Message, error: type
) -> None:
    """Items are prepared while the COPY streams: an invalid one stops it after earlier rows
    were sent, and rolling back to the savepoint takes them back; the transaction goes on."""
    noise = [secrets.token_hex(1000) for _ in range(400)]  # 2 KB rows that do not compress
    messages = [
        Message("t", {"n": i, "noise": noise[i]}, idempotency_key=f"s-{i}") for i in range(400)
    ]
    messages.insert(390, bad)
    pages = sa.text("SELECT pg_total_relation_size('outboxkit.outbox_message') / 8192")
    with engine.connect() as conn:
        INSERTING.add(conn, Message("t", b"mine"), idempotency_key="before")
        before = conn.execute(pages).scalar_one()
        with pytest.raises(error):
            COPYING.add_many(conn, messages)
        # The server had stored rows already (pages stay after a rollback: at least 100
        # rows of 2 KB), then the savepoint undid them.
        assert conn.execute(pages).scalar_one() - before >= 25
        COPYING.add_many(conn, batch(400, "s"))  # the same keys are free: nothing was kept
        conn.commit()
    keys = sorted(r.idempotency_key for r in stored(engine))
    assert keys == sorted(["before"] + [f"s-{i}" for i in range(400)])
