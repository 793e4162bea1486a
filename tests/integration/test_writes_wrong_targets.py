"""Something other than a Session or Connection of the right kind (sync or async) is refused
with an error naming what was given and what is taken; nothing is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from outboxkit.errors import SerializationError, WrongTargetError
from outboxkit.events import Event, Message
from outboxkit.outbox import Outbox

pytestmark = pytest.mark.integration

OUTBOX = Outbox(copy_min_rows=10)
MESSAGE = Message("t", b"x")


class Placed(Event, topic="orders", key="order_id"):
    order_id: str


WRITES: dict[str, Callable[[Any], Any]] = {
    "add": lambda target: OUTBOX.add(target, MESSAGE),
    "add_many": lambda target: OUTBOX.add_many(target, [MESSAGE, Message("t", b"y")]),
    "add_many_copy": lambda target: OUTBOX.add_many(target, [MESSAGE] * 20),
    "add_many_empty": lambda target: OUTBOX.add_many(target, []),
}
ASYNC_WRITES: dict[str, Callable[[Any], Any]] = {
    "add": lambda target: OUTBOX.add_async(target, MESSAGE),
    "add_many": lambda target: OUTBOX.add_many_async(target, [MESSAGE, Message("t", b"y")]),
    "add_many_copy": lambda target: OUTBOX.add_many_async(target, [MESSAGE] * 20),
    "add_many_empty": lambda target: OUTBOX.add_many_async(target, []),
}


def count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        query = "SELECT count(*) FROM outboxkit.outbox_message"
        return int(conn.execute(sa.text(query)).scalar_one())


@pytest.mark.parametrize("write", WRITES.values(), ids=WRITES.keys())
async def test_sync_writes_refuse_other_targets(
    engine: sa.Engine, aengine: AsyncEngine, outboxkit_db_url: str, write: Callable[[Any], Any]
) -> None:
    with psycopg.connect(outboxkit_db_url) as raw:
        async with AsyncSession(aengine) as session, aengine.connect() as conn:
            for target, name in [
                (engine, "Engine"),
                (None, "NoneType"),
                (raw, "psycopg.Connection"),
                (session, "AsyncSession"),
                (conn, "AsyncConnection"),
            ]:
                with pytest.raises(WrongTargetError, match="a Session or Connection") as raised:
                    write(target)
                assert name in str(raised.value)
                assert isinstance(raised.value, TypeError)
    assert "add_async" in str(raised.value)  # an async target: the way to write on it
    assert count(engine) == 0


@pytest.mark.parametrize("write", ASYNC_WRITES.values(), ids=ASYNC_WRITES.keys())
async def test_async_writes_refuse_other_targets(
    engine: sa.Engine, aengine: AsyncEngine, write: Callable[[Any], Any]
) -> None:
    with Session(engine) as session, engine.connect() as conn:
        for target, name in [
            (aengine, "AsyncEngine"),
            (engine, "Engine"),
            (None, "NoneType"),
            (session, "Session"),
            (conn, "Connection"),
        ]:
            with pytest.raises(WrongTargetError, match="an AsyncSession or AsyncConnection") as e:
                await write(target)
            assert name in str(e.value)
    assert "add/add_many" in str(e.value)
    assert count(engine) == 0


@pytest.mark.parametrize("headers", ["ab", 5, [("a", "b")]], ids=["str", "int", "list"])
@pytest.mark.parametrize("item", [MESSAGE, Placed(order_id="o-1")], ids=["message", "event"])
async def test_add_refuses_headers_that_are_not_a_mapping(
    engine: sa.Engine, aengine: AsyncEngine, headers: Any, item: Any
) -> None:
    """As a Message's own headers are refused (a list of pairs was taken before)."""
    with engine.connect() as conn, pytest.raises(SerializationError, match="map str to str"):
        OUTBOX.add(conn, item, headers=headers)
    async with aengine.connect() as aconn:
        with pytest.raises(SerializationError, match="map str to str"):
            await OUTBOX.add_async(aconn, item, headers=headers)
    assert count(engine) == 0


def test_a_scoped_session_writes_in_its_scopes_session(engine: sa.Engine) -> None:
    """A ``scoped_session`` (Flask-SQLAlchemy's ``db.session``) is its current session."""
    scoped = sa.orm.scoped_session(sa.orm.sessionmaker(engine))
    try:
        OUTBOX.add(scoped, MESSAGE)
        assert OUTBOX.add_many(scoped, []) == []
        scoped.commit()
    finally:
        scoped.remove()
    assert count(engine) == 1
