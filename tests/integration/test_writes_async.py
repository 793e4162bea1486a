"""Writes on an AsyncSession/AsyncConnection against the real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from outboxkit.errors import (
    IdempotencyKeyConflictError,
    InvalidTopicError,
    PayloadTooLargeError,
    SerializationError,
)
from outboxkit.events import Event, Message
from outboxkit.outbox import Outbox
from outboxkit.testing import assert_outboxed_async, outboxed_async

_OUTBOX = Outbox()  # the default configuration (schema "outboxkit")
add_async = _OUTBOX.add_async
add_many_async = _OUTBOX.add_many_async

pytestmark = pytest.mark.integration


class OrderPlaced(Event, topic="orders", key="order_id", event_type="order.placed"):
    order_id: str
    total_cents: int


@pytest.fixture
async def engine(sa_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_async_engine(sa_url)
    async with eng.begin() as conn:
        await conn.execute(sa.text("CREATE TABLE app_order (id text PRIMARY KEY, status text)"))
    yield eng
    await eng.dispose()


async def count_rows(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        result = await conn.execute(sa.text("SELECT count(*) FROM outboxkit.outbox_message"))
        return int(result.scalar_one())


async def test_commit_and_rollback_with_async_session(engine: AsyncEngine) -> None:
    async with AsyncSession(engine) as session:
        async with session.begin():
            await session.execute(sa.text("INSERT INTO app_order VALUES ('o-1', 'placed')"))
            result = await add_async(session, OrderPlaced(order_id="o-1", total_cents=1))
            await assert_outboxed_async(session, key="o-1", count=1)
        async with session.begin():
            await add_async(session, OrderPlaced(order_id="o-2", total_cents=2))
            await add_many_async(session, [Message("t", b"x"), Message("t", b"y")])
            await session.rollback()
    assert await count_rows(engine) == 1
    async with engine.connect() as conn:
        row = (await conn.execute(sa.text("SELECT * FROM outboxkit.outbox_message"))).one()
    assert row.event_id == result.event_id
    assert json.loads(bytes(row.payload)) == {"order_id": "o-1", "total_cents": 1}


async def test_duplicates_and_conflicts_with_async_connection(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        first = await add_async(conn, Message("t", {"v": 1}), idempotency_key="k")
    async with engine.connect() as conn:
        again = await add_async(conn, Message("t", {"v": 1}), idempotency_key="k")
        assert again.duplicate
        assert again.event_id == first.event_id
        with pytest.raises(IdempotencyKeyConflictError):
            await add_async(conn, Message("t", {"v": 2}), idempotency_key="k")
        results = await add_many_async(
            conn,
            [
                Message("t", {"v": 1}, idempotency_key="k"),
                Message("t", {"v": 3}, idempotency_key="m"),
                Message("t", {"v": 3}, idempotency_key="m"),
            ],
        )
        assert [r.duplicate for r in results] == [True, False, True]
        with pytest.raises(IdempotencyKeyConflictError):
            await add_many_async(
                conn,
                [
                    Message("t", {"v": 4}, idempotency_key="n"),
                    Message("t", {}, idempotency_key="k"),
                ],
            )
        assert sorted(m.idempotency_key for m in await outboxed_async(conn)) == ["k", "m"]
        await conn.commit()
    assert await count_rows(engine) == 2


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message("t", b"x" * 2_000), PayloadTooLargeError),
        (Message("a/b", b"x"), InvalidTopicError),
        (Message("t", {"x": {1, 2}}), SerializationError),
    ],
)
async def test_validation_errors_write_nothing(
    engine: AsyncEngine, message: Message, error: type
) -> None:
    outbox = Outbox(max_message_bytes=1_000)
    async with AsyncSession(engine) as session:
        with pytest.raises(error):
            await outbox.add_async(session, message)
        with pytest.raises(error):
            await outbox.add_many_async(session, [Message("t", b"ok"), message])
        await outbox.add_async(session, Message("t", b"ok"))
        await session.commit()
    assert await count_rows(engine) == 1
