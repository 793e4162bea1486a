"""Two real transactions racing for the same idempotency key (sync threads and asyncio tasks).

The second writer must block on the unique index until the first ends, then: the first committed
the same content -> duplicate with the first's event id; other content -> conflict error; the
first rolled back -> the second's row is written. Never two rows, never a wrong answer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from outboxkit.errors import IdempotencyKeyConflictError
from outboxkit.events import Message
from outboxkit.outbox import Outbox, WriteResult

_OUTBOX = Outbox()  # the default configuration (schema "outboxkit")
add = _OUTBOX.add
add_async = _OUTBOX.add_async
add_many = _OUTBOX.add_many
add_many_async = _OUTBOX.add_many_async

pytestmark = pytest.mark.integration

KEY = "charge-42"
CASES = [
    # (first transaction ends with, second writer's content, expected outcome)
    ("commit", "same", "duplicate"),
    ("commit", "other", "conflict"),
    ("rollback", "same", "written"),
    ("rollback", "other", "written"),
]


def msg(content: str, key: str = KEY) -> Message:
    return Message("payments", {"content": content}, key="acct-1", idempotency_key=key)


@pytest.fixture
def engine(sa_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(sa_url, pool_size=5)
    yield eng
    eng.dispose()


@pytest.fixture
async def aengine(sa_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(sa_url, pool_size=5)
    yield eng
    await eng.dispose()


def wait_until_blocked(engine: sa.Engine, pid: int, deadline_s: float = 60.0) -> None:
    """Poll pg_stat_activity until backend ``pid`` waits on a lock (the unique index)."""
    end = time.monotonic() + deadline_s
    with engine.connect() as probe:
        while time.monotonic() < end:
            waiting = probe.execute(
                sa.text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": pid},
            ).scalar()
            probe.rollback()
            if waiting == "Lock":
                return
            time.sleep(0.02)
    raise AssertionError(f"backend {pid} never blocked on the first transaction's key")


def stored(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT event_id, payload FROM outboxkit.outbox_message"
                    " WHERE idempotency_key = :k"
                ),
                {"k": KEY},
            )
        )


def race(
    engine: sa.Engine, first_end: str, second: Callable[[sa.Connection], Any]
) -> tuple[WriteResult, Any]:
    outcome: dict[str, Any] = {}
    with engine.connect() as first, engine.connect() as other:
        first_result = add(first, msg("same"))
        pid = other.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()

        def run() -> None:
            try:
                outcome["value"] = second(other)
                other.commit()
            except Exception as exc:
                outcome["error"] = exc
                other.rollback()

        thread = threading.Thread(target=run)
        thread.start()
        try:
            wait_until_blocked(engine, pid)
            assert "value" not in outcome
            assert "error" not in outcome  # still waiting for the first transaction
        finally:
            (first.commit if first_end == "commit" else first.rollback)()
            thread.join(timeout=120)
        assert not thread.is_alive()
    return first_result, outcome.get("value", outcome.get("error"))


@pytest.mark.parametrize(("first_end", "content", "expected"), CASES)
def test_sync_same_key_race(engine: sa.Engine, first_end: str, content: str, expected: str) -> None:
    first, second = race(engine, first_end, lambda conn: add(conn, msg(content)))
    rows = stored(engine)
    assert len(rows) == 1
    if expected == "duplicate":
        assert isinstance(second, WriteResult)
        assert second.duplicate
        assert second.event_id == first.event_id
    elif expected == "conflict":
        assert isinstance(second, IdempotencyKeyConflictError)
        assert rows[0].event_id == first.event_id
    else:
        assert isinstance(second, WriteResult)
        assert not second.duplicate
        assert second.event_id != first.event_id
        assert rows[0].event_id == second.event_id
        assert bytes(rows[0].payload) == f'{{"content":"{content}"}}'.encode()


@pytest.mark.parametrize("first_end", ["commit", "rollback"])
def test_sync_add_many_race(engine: sa.Engine, first_end: str) -> None:
    first, second = race(
        engine,
        first_end,
        lambda conn: add_many(conn, [msg("x", key="other-1"), msg("same"), msg("y", "other-2")]),
    )
    assert isinstance(second, list)
    assert [r.duplicate for r in second] == [False, first_end == "commit", False]
    assert (second[1].event_id == first.event_id) is (first_end == "commit")
    assert len(stored(engine)) == 1


def test_sync_add_many_race_conflict_writes_nothing(engine: sa.Engine) -> None:
    _, second = race(
        engine, "commit", lambda conn: add_many(conn, [msg("x", key="other-1"), msg("other")])
    )
    assert isinstance(second, IdempotencyKeyConflictError)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM outboxkit.outbox_message")).scalar() == 1


async def wait_until_blocked_async(engine: AsyncEngine, pid: int, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    async with engine.connect() as probe:
        while time.monotonic() < end:
            result = await probe.execute(
                sa.text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": pid},
            )
            waiting = result.scalar()
            await probe.rollback()
            if waiting == "Lock":
                return
            await asyncio.sleep(0.02)
    raise AssertionError(f"backend {pid} never blocked on the first transaction's key")


@pytest.mark.parametrize(("first_end", "content", "expected"), CASES)
@pytest.mark.parametrize("bulk", [False, True])
async def test_async_same_key_race(
    aengine: AsyncEngine, first_end: str, content: str, expected: str, bulk: bool
) -> None:
    async with aengine.connect() as first, aengine.connect() as other:
        first_result = await add_async(first, msg("same"))
        pid = (await other.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one()

        async def second() -> WriteResult:
            if bulk:
                results = await add_many_async(other, [msg("z", key="other-1"), msg(content)])
                result = results[1]
            else:
                result = await add_async(other, msg(content))
            await other.commit()
            return result

        task = asyncio.create_task(second())
        try:
            await wait_until_blocked_async(aengine, pid)
            assert not task.done()
        finally:
            await (first.commit() if first_end == "commit" else first.rollback())
        if expected == "conflict":
            with pytest.raises(IdempotencyKeyConflictError):
                await asyncio.wait_for(task, timeout=120)
            await other.rollback()
        else:
            result = await asyncio.wait_for(task, timeout=120)
            assert result.duplicate is (expected == "duplicate")
            assert (result.event_id == first_result.event_id) is (expected == "duplicate")
    async with aengine.connect() as conn:
        rows = (
            (
                await conn.execute(
                    sa.text("SELECT idempotency_key FROM outboxkit.outbox_message ORDER BY id")
                )
            )
            .scalars()
            .all()
        )
    assert rows.count(KEY) == 1
    assert ("other-1" in rows) is (bulk and expected != "conflict")
