"""Example 05: a deduplicating consumer with aiokafka (asyncio).

The loyalty service awards points for each ``order.placed`` event: an async handler adds a row
to the ``AsyncSession`` it is given, and outboxkit commits it with the event's dedup ("inbox")
row before the Kafka offset. A redelivered event is recognised and skipped, so points are
awarded once per order. To show it, the topic is read twice, the second time from the beginning
under a new consumer group (as after an offset reset).

    eval $(outboxkit dev env) && outboxkit migrate up
    python examples/02_sync_script/place_orders.py       # write orders and their events
    python examples/07_embedded_relay/embedded_relay.py   # publish them (or `outboxkit relay run`)
    python examples/05_consumer_aiokafka/loyalty_consumer.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections import Counter

import pydantic
from sqlalchemy import func, make_url, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit.inbox import AsyncInbox, EventRegistry, HandlerContext, InboxSettings
from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer
from outboxkit.settings import KafkaSettings, load_kafka_settings

TOPIC = os.environ.get("EXAMPLE_TOPIC", "example.orders")


class Base(DeclarativeBase):
    pass


class PointsAward(Base):
    """The effect. No unique constraint on purpose: only the inbox keeps it from doubling."""

    __tablename__ = "example_points_award"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str]
    order_id: Mapped[str]
    points: Mapped[int]


class OrderPlaced(pydantic.BaseModel):
    """The fields this consumer needs; extra fields in the payload are ignored."""

    order_id: str
    customer: str
    total_cents: int


registry = EventRegistry()


@registry.handler(OrderPlaced, event_type="order.placed")
async def award_points(event: OrderPlaced, ctx: HandlerContext, session: AsyncSession) -> None:
    points = event.total_cents // 100
    session.add(PointsAward(customer=event.customer, order_id=event.order_id, points=points))


async def consume(inbox: AsyncInbox, kafka: KafkaSettings, expected: int | None) -> Counter[str]:
    """Read the topic from the start under a new group: ``expected`` records, or until none
    came for a while (joining the group takes a few seconds, hence more patience at first)."""
    outcomes: Counter[str] = Counter()
    group_id = f"loyalty-{uuid.uuid4().hex[:6]}"
    async with AiokafkaInboxConsumer(inbox, kafka, group_id=group_id, topics=[TOPIC]) as consumer:
        idle_since = time.monotonic()
        while sum(outcomes.values()) != expected:
            if time.monotonic() - idle_since > (5.0 if outcomes else 30.0):
                break
            outcome = await consumer.poll_once(wait=0.5)
            if outcome is not None:
                outcomes[outcome.kind.value] += 1
                idle_since = time.monotonic()
    return outcomes


async def awards(engine: AsyncEngine) -> dict[str, int]:
    async with AsyncSession(engine) as session:
        rows = await session.execute(
            select(PointsAward.order_id, func.count()).group_by(PointsAward.order_id)
        )
        return dict(rows.all())


async def main(
    database_url: str, kafka: KafkaSettings, expected: int | None = None
) -> tuple[list[Counter[str]], dict[str, int]]:
    """Outcomes of both passes, and point awards per order (one each)."""
    url = make_url(database_url).set(drivername="postgresql+psycopg")
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        inbox = AsyncInbox(engine, InboxSettings(consumer="loyalty", registry=registry))
        first = await consume(inbox, kafka, expected)
        second = await consume(inbox, kafka, expected)  # everything again: all duplicates
        return [first, second], await awards(engine)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    # [kafka] from OUTBOXKIT_CONFIG, OUTBOXKIT_KAFKA_*, the secrets dir (security: example 08).
    passes, per_order = asyncio.run(
        main(os.environ["OUTBOXKIT_DATABASE_URL"], load_kafka_settings())
    )
    for number, outcomes in enumerate(passes, 1):
        print(f"pass {number}: {dict(outcomes)}")
    print(f"point awards per order: {per_order}")
    sys.exit(0 if per_order and set(per_order.values()) == {1} else 1)
