"""The writer refuses a connection in autocommit mode: its rows would commit on their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from outboxkit.errors import ConfigurationError
from outboxkit.events import Message
from outboxkit.outbox import Outbox

pytestmark = pytest.mark.integration

INSERTING = Outbox(copy_min_rows=None)
COPYING = Outbox(copy_min_rows=10)
AUTOCOMMIT = {"isolation_level": "AUTOCOMMIT"}


def messages(n: int) -> list[Message]:
    return [Message("t", {"n": i}, key=f"k-{i}") for i in range(n)]


# Every way of writing: one row, an INSERT of two (the savepoint), a COPY of twenty.
WRITES: dict[str, Callable[[Any], Any]] = {
    "add": lambda conn: INSERTING.add(conn, Message("t", b"x")),
    "add_many": lambda conn: INSERTING.add_many(conn, messages(2)),
    "add_many_copy": lambda conn: COPYING.add_many(conn, messages(20)),
}
ASYNC_WRITES: dict[str, Callable[[Any], Any]] = {
    "add": lambda conn: INSERTING.add_async(conn, Message("t", b"x")),
    "add_many": lambda conn: INSERTING.add_many_async(conn, messages(2)),
    "add_many_copy": lambda conn: COPYING.add_many_async(conn, messages(20)),
}


def count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(sa.text("SELECT count(*) FROM outboxkit.outbox_message")).scalar_one()
        )


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
def test_an_autocommit_engine_is_refused_and_nothing_written(
    engine: sa.Engine, write: Callable[[Any], Any]
) -> None:
    autocommit = engine.execution_options(**AUTOCOMMIT)
    with autocommit.connect() as conn, pytest.raises(ConfigurationError, match="autocommit"):
        write(conn)
    with Session(autocommit) as session, pytest.raises(ConfigurationError, match="autocommit"):
        write(session)
    with engine.connect() as conn:
        conn = conn.execution_options(**AUTOCOMMIT)
        with pytest.raises(ConfigurationError, match="autocommit"):
            write(conn)
    assert count(engine) == 0


def test_a_connection_in_a_transaction_still_writes(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        for write in WRITES.values():
            write(conn)
        conn.commit()
    assert count(engine) == 1 + 2 + 20


@pytest.mark.parametrize("write", ASYNC_WRITES.values(), ids=ASYNC_WRITES.keys())
async def test_an_async_autocommit_engine_is_refused_and_nothing_written(
    aengine: AsyncEngine, engine: sa.Engine, write: Callable[[Any], Any]
) -> None:
    autocommit = aengine.execution_options(**AUTOCOMMIT)
    async with autocommit.connect() as conn:
        with pytest.raises(ConfigurationError, match="autocommit"):
            await write(conn)
    async with AsyncSession(autocommit) as session:
        with pytest.raises(ConfigurationError, match="autocommit"):
            await write(session)
    async with aengine.connect() as conn:
        conn = await conn.execution_options(**AUTOCOMMIT)
        with pytest.raises(ConfigurationError, match="autocommit"):
            await write(conn)
    assert count(engine) == 0
