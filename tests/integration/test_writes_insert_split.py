"""add_many's INSERT path in several statements, on the real PostgreSQL.

PostgreSQL closes the connection on a protocol message over 1 GB, and one INSERT used to carry
every row of a call: a call of 1,100 rows of 990 KB lost the caller's transaction. The rows now
go in INSERTs of at most ``INSERT_MAX_BYTES`` each (made small here), in the call's savepoint:
results, duplicates and all-or-nothing stay those of one statement.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from outboxkit import outbox_plan
from outboxkit.errors import IdempotencyKeyConflictError
from outboxkit.events import Message
from outboxkit.outbox import Outbox

pytestmark = pytest.mark.integration

INSERTING = Outbox(copy_min_rows=None)
COPYING = Outbox(copy_min_rows=10)


def _messages(count: int, tag: str = "") -> list[Message]:
    return [
        Message(
            "t",
            {"n": n, "tag": tag, "fill": "x" * 500},
            key=f"{n:03d}",
            idempotency_key=f"k{n:03d}",
        )
        for n in range(count)
    ]


@pytest.fixture
def small_inserts(monkeypatch: pytest.MonkeyPatch) -> None:
    """About ten of these rows per INSERT."""
    monkeypatch.setattr(outbox_plan, "INSERT_MAX_BYTES", 10 * 900)


@pytest.fixture
def inserts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The row count of each outbox INSERT the writer runs (the driver runs each statement the
    plan hands out)."""
    counts: list[int] = []
    plan_insert = outbox_plan.Plan.insert_statement

    def counted(plan: outbox_plan.Plan, notified: tuple[str | None, list[int]]) -> Any:
        statement = plan_insert(plan, notified)
        counts.append(len(plan.sent))
        return statement

    monkeypatch.setattr(outbox_plan.Plan, "insert_statement", counted)
    return counts


def _keys(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        query = sa.text("SELECT idempotency_key FROM outboxkit.outbox_message ORDER BY id")
        return list(conn.execute(query).scalars())


@pytest.mark.usefixtures("small_inserts")
def test_a_large_call_is_written_by_several_inserts(engine: sa.Engine, inserts: list[int]) -> None:
    with engine.begin() as conn:
        results = INSERTING.add_many(conn, _messages(35))
    assert len(inserts) >= 3
    assert sum(inserts) == 35
    assert max(inserts) < 35
    assert _keys(engine) == [f"k{n:03d}" for n in range(35)]
    assert [r.id for r in results] == sorted(r.id for r in results)
    assert not any(r.duplicate for r in results)


@pytest.mark.usefixtures("small_inserts")
def test_keys_taken_in_later_inserts_are_duplicates(engine: sa.Engine, inserts: list[int]) -> None:
    messages = _messages(35)
    with engine.begin() as conn:
        first = INSERTING.add_many(conn, [messages[2], messages[31]])
    inserts.clear()
    with engine.begin() as conn:
        results = INSERTING.add_many(conn, messages)
    assert len(inserts) >= 3
    assert [r.duplicate for r in results] == [n in (2, 31) for n in range(35)]
    assert (results[2].event_id, results[31].event_id) == (first[0].event_id, first[1].event_id)
    assert sorted(_keys(engine)) == [f"k{n:03d}" for n in range(35)]


@pytest.mark.usefixtures("small_inserts")
def test_other_content_in_a_later_insert_undoes_the_whole_call(
    engine: sa.Engine, inserts: list[int]
) -> None:
    with engine.begin() as conn:
        INSERTING.add_many(conn, [_messages(35, tag="first")[30]])
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TEMP TABLE mine (n int)"))
        conn.execute(sa.text("INSERT INTO mine VALUES (1)"))
        inserts.clear()
        with pytest.raises(IdempotencyKeyConflictError, match="k030"):
            INSERTING.add_many(conn, _messages(35, tag="second"))
        assert len(inserts) >= 3  # the rows before k030 had been written ...
        assert conn.execute(sa.text("SELECT count(*) FROM mine")).scalar_one() == 1
    assert _keys(engine) == ["k030"]  # ... and are undone; the caller's own write stays


@pytest.mark.usefixtures("small_inserts")
def test_a_refused_copy_falls_back_to_split_inserts(engine: sa.Engine, inserts: list[int]) -> None:
    messages = _messages(35)
    with engine.begin() as conn:
        INSERTING.add_many(conn, [messages[20]])
    inserts.clear()
    with engine.begin() as conn:
        results = COPYING.add_many(conn, messages)
    assert len(inserts) >= 3
    assert max(inserts) < 35
    assert [r.duplicate for r in results] == [n == 20 for n in range(35)]


@pytest.mark.usefixtures("small_inserts")
async def test_async_writes_split_alike(aengine: AsyncEngine, engine: sa.Engine) -> None:
    messages = _messages(35)
    async with aengine.begin() as conn:
        await INSERTING.add_many_async(conn, [messages[25]])
    async with aengine.begin() as conn:
        results = await INSERTING.add_many_async(conn, messages)
    assert [r.duplicate for r in results] == [n == 25 for n in range(35)]
    assert sorted(_keys(engine)) == [f"k{n:03d}" for n in range(35)]
