"""A second write starting on a connection another write is running on is refused, before it
sends anything; the first write is unaffected (tasks gathered on one AsyncSession, threads
sharing one Session). Interleaved, a conflict's rollback undid rows the other had reported
written."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from outboxkit.errors import SharedConnectionError
from outboxkit.events import Message
from outboxkit.outbox import Outbox, WriteResult
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

OUTBOX = Outbox(copy_min_rows=10)


def keyed(prefix: str, n: int, **payload: int) -> list[Message]:
    return [Message("t", {"i": i, **payload}, idempotency_key=f"{prefix}-{i}") for i in range(n)]


def count(engine: sa.Engine, prefix: str) -> int:
    with engine.connect() as conn:
        query = "SELECT count(*) FROM outboxkit.outbox_message WHERE idempotency_key LIKE :p"
        return int(conn.execute(sa.text(query), {"p": f"{prefix}-%"}).scalar_one())


@pytest.mark.parametrize("rows", [3, 20], ids=["insert", "copy"])
async def test_gathered_add_many_on_one_async_connection(
    engine: sa.Engine, aengine: AsyncEngine, rows: int
) -> None:
    async with aengine.begin() as conn:
        await OUTBOX.add_async(conn, Message("t", {"v": 0}), idempotency_key="taken")
    bad = [*keyed("bad", rows), Message("t", {"v": 1}, idempotency_key="taken")]
    async with aengine.connect() as conn:
        await conn.begin()
        good, refused = await asyncio.gather(
            OUTBOX.add_many_async(conn, keyed("good", rows)),
            OUTBOX.add_many_async(conn, bad),
            return_exceptions=True,
        )
        assert isinstance(refused, SharedConnectionError)
        assert isinstance(good, list)
        assert [r.duplicate for r in good] == [False] * rows
        await conn.commit()
    assert count(engine, "good") == rows  # reported written: written
    assert count(engine, "bad") == 0


async def test_gathered_adds_on_one_async_session(engine: sa.Engine, aengine: AsyncEngine) -> None:
    async with AsyncSession(aengine) as session, session.begin():
        await session.execute(sa.text("SELECT 1"))  # its connection is taken
        first, second = await asyncio.gather(
            OUTBOX.add_async(session, Message("t", b"x"), idempotency_key="one-1"),
            OUTBOX.add_async(session, Message("t", b"y"), idempotency_key="one-2"),
            return_exceptions=True,
        )
        assert isinstance(first, WriteResult)
        assert isinstance(second, SharedConnectionError)
        # the mark is gone once the write ended: the session writes on
        await OUTBOX.add_async(session, Message("t", b"z"), idempotency_key="one-3")
    assert count(engine, "one") == 2


def test_threads_sharing_one_session(engine: sa.Engine) -> None:
    """The first thread's write waits on a key another transaction holds until the second
    thread's write has ended, so the two overlap for certain (no timing)."""
    outcome: dict[str, Any] = {}

    def write(name: str) -> None:
        try:
            outcome[name] = OUTBOX.add_many(session, keyed(name, 2))
        except Exception as exc:
            outcome[name] = exc

    with engine.connect() as blocker, Session(engine) as session, session.begin():
        blocker.begin()
        OUTBOX.add(blocker, Message("t", {"i": 0}), idempotency_key="first-0")
        first = threading.Thread(target=write, args=("first",))
        first.start()
        wait_for(
            lambda: _waiting_on_a_lock(engine) or not first.is_alive(),
            what="the first write waiting on the held key",
        )
        assert first.is_alive(), outcome  # it waits on the lock, it did not fail
        second = threading.Thread(target=write, args=("second",))
        second.start()
        second.join(10)  # refused at once; before the fix it waited for the first
        outcome.setdefault("second", "still running")
        blocker.rollback()  # the first write's insert goes through
        first.join(30)
        second.join(30)
    assert isinstance(outcome["second"], SharedConnectionError)
    assert [r.duplicate for r in outcome["first"]] == [False, False]
    assert count(engine, "first") == 2
    assert count(engine, "second") == 0


def _waiting_on_a_lock(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        return bool(conn.execute(sa.text(query)).scalar_one())
