"""The opt-in before_flush hook: entities record events, the flush writes them, same transaction."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outboxkit.errors import InvalidTopicError
from outboxkit.events import Event, Message
from outboxkit.flush_hook import DomainEvents, FlushHook
from outboxkit.testing import assert_outboxed, outboxed

pytestmark = pytest.mark.integration


class Base(DeclarativeBase):
    pass


class OrderPlaced(Event, topic="orders", key="order_id", event_type="order.placed"):
    order_id: str


class OrderShipped(Event, topic="orders", key="order_id", event_type="order.shipped"):
    order_id: str


class Order(Base, DomainEvents):
    __tablename__ = "hook_order"
    id: Mapped[str] = mapped_column(primary_key=True)
    status: Mapped[str]

    @classmethod
    def place(cls, order_id: str) -> Order:
        order = cls(id=order_id, status="placed")
        order.record_event(OrderPlaced(order_id=order_id))
        return order

    def ship(self) -> None:
        self.status = "shipped"
        self.record_event(OrderShipped(order_id=self.id))


@pytest.fixture
def engine(sa_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(sa_url)
    Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def hook() -> Iterator[FlushHook]:
    installed = FlushHook().install(Session)
    yield installed
    installed.remove()


def committed(engine: sa.Engine) -> list[tuple[str | None, str | None]]:
    with engine.connect() as conn:
        return [(m.event_type, m.key) for m in outboxed(conn)]


@pytest.mark.usefixtures("hook")
def test_flush_writes_recorded_events_in_the_same_transaction(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        order = Order.place("o-1")
        session.add(order)
        session.flush()
        assert order.recorded_events() == []
        assert_outboxed(session, event_type="order.placed", key="o-1", count=1)
        order.ship()
    assert committed(engine) == [("order.placed", "o-1"), ("order.shipped", "o-1")]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT status FROM hook_order")).scalar() == "shipped"


@pytest.mark.usefixtures("hook")
def test_rollback_discards_state_and_events(engine: sa.Engine) -> None:
    with Session(engine) as session:
        session.add(Order.place("o-1"))
        session.flush()
        session.rollback()
    assert committed(engine) == []
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM hook_order")).scalar() == 0


@pytest.mark.usefixtures("hook")
def test_event_without_state_change_is_written_at_commit(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        session.add(Order(id="o-1", status="placed"))
    with Session(engine) as session, session.begin():
        order = session.get(Order, "o-1")
        assert order is not None
        order.record_event(Message("audit", {"viewed": "o-1"}, event_type="order.viewed"))
    assert committed(engine) == [("order.viewed", None)]


@pytest.mark.usefixtures("hook")
def test_failed_write_keeps_the_events_and_aborts_the_flush(engine: sa.Engine) -> None:
    with Session(engine) as session:
        order = Order.place("o-1")
        order.record_event(Message("bad topic!", b"x"))
        session.add(order)
        with pytest.raises(InvalidTopicError):
            session.flush()
        assert len(order.recorded_events()) == 2
        session.rollback()
    assert committed(engine) == []


def test_without_the_hook_nothing_is_written(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        session.add(Order.place("o-1"))
    assert committed(engine) == []


async def test_async_session(sa_url: str, engine: sa.Engine) -> None:
    aengine = create_async_engine(sa_url)
    try:
        async with AsyncSession(aengine) as session:
            hook = FlushHook().install(session.sync_session)
            try:
                async with session.begin():
                    order = Order.place("o-async")
                    session.add(order)
                    await session.flush()
                    order.ship()
            finally:
                hook.remove()
    finally:
        await aengine.dispose()
    assert committed(engine) == [("order.placed", "o-async"), ("order.shipped", "o-async")]
