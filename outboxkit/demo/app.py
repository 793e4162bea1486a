"""The demo's little shop: its tables, its events, and the consumer's handler.

Each order goes through three events (placed, packed, shipped), each written in a transaction
of its own, all keyed by the order id. The consumer charges an order when it sees it placed and
records every event it applied. The effect tables deliberately have no unique constraints: only
the inbox stands between a redelivered event and a double charge.

The consumer process imports :data:`REGISTRY` or :data:`ASYNC_REGISTRY`, by Kafka client
(``outboxkit inbox run --registry``).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outboxkit.events import Event
from outboxkit.inbox import EventRegistry, HandlerContext

TABLES = sa.MetaData()
demo_order = sa.Table(
    "demo_order",
    TABLES,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("amount_cents", sa.Integer, nullable=False),
)
demo_charge = sa.Table(  # the consumer's side effect that must happen exactly once
    "demo_charge",
    TABLES,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("order_id", sa.Text, nullable=False),
    sa.Column("amount_cents", sa.Integer, nullable=False),
    sa.Column("event_id", sa.Text, nullable=False),
)
demo_applied = sa.Table(  # every event the consumer applied, in the order it applied them
    "demo_applied",
    TABLES,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("order_id", sa.Text, nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("event_id", sa.Text, nullable=False),
)


class OrderEvent(Event):
    """What every order event carries; ``seq`` is its place in the order's life."""

    order_id: str
    seq: int


# Keyed by order (each concrete class says so: an intermediate class without a topic declares
# nothing), so all of an order's events share a partition and keep their order. The topic is a
# default: the demo writes each run to a topic of its own.
class OrderPlaced(OrderEvent, topic="demo.orders", key="order_id", event_type="demo.order.placed"):
    amount_cents: int


class OrderPacked(OrderEvent, topic="demo.orders", key="order_id", event_type="demo.order.packed"):
    pass


class OrderShipped(
    OrderEvent, topic="demo.orders", key="order_id", event_type="demo.order.shipped"
):
    pass


LIFECYCLE: tuple[type[OrderEvent], ...] = (OrderPlaced, OrderPacked, OrderShipped)

REGISTRY = EventRegistry()  # for the sync driver (confluent-kafka)
ASYNC_REGISTRY = EventRegistry()  # for the asyncio driver (aiokafka)


def _effects(event: OrderEvent, ctx: HandlerContext) -> list[sa.Insert]:
    """The handler's writes: a charge when an order is placed, and a record of every event."""
    applied = demo_applied.insert().values(
        order_id=event.order_id, seq=event.seq, event_id=ctx.event_id
    )
    if not isinstance(event, OrderPlaced):
        return [applied]
    charge = demo_charge.insert().values(
        order_id=event.order_id, amount_cents=event.amount_cents, event_id=ctx.event_id
    )
    return [charge, applied]


@REGISTRY.handler(*LIFECYCLE)
def apply(event: OrderEvent, ctx: HandlerContext, session: Session) -> None:
    """The effects, in the same transaction as the inbox row that makes them happen once."""
    for statement in _effects(event, ctx):
        session.execute(statement)


@ASYNC_REGISTRY.handler(*LIFECYCLE)
async def apply_async(event: OrderEvent, ctx: HandlerContext, session: AsyncSession) -> None:
    for statement in _effects(event, ctx):
        await session.execute(statement)
