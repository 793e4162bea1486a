"""Example 04: a deduplicating consumer with confluent-kafka (sync).

The shipping service books one shipment per ``order.placed`` event. Its handler only adds rows
to the session it is given: outboxkit commits them together with the event's dedup ("inbox") row,
then commits the Kafka offset. A redelivered event (a crash before the offset commit, a
rebalance, a replay) finds its inbox row and is skipped, so no order is shipped twice.

The consumer defines its own model of the event (a plain pydantic model named by its event type):
it does not import the producer's class. To show the dedup, the script reads the topic twice,
the second time from the beginning under a new consumer group (as after an offset reset).

    eval $(outboxkit dev env) && outboxkit migrate up
    python examples/02_sync_script/place_orders.py       # write orders and their events
    python examples/07_embedded_relay/embedded_relay.py   # publish them (or `outboxkit relay run`)
    python examples/04_consumer_confluent/shipping_consumer.py
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections import Counter

import pydantic
from sqlalchemy import Engine, create_engine, func, make_url, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outboxkit.inbox import EventRegistry, HandlerContext, Inbox, InboxSettings
from outboxkit.inbox.confluent import ConfluentInboxConsumer
from outboxkit.settings import KafkaSettings, load_kafka_settings

TOPIC = os.environ.get("EXAMPLE_TOPIC", "example.orders")


class Base(DeclarativeBase):
    pass


class Shipment(Base):
    """The effect. No unique constraint on purpose: only the inbox keeps it from doubling."""

    __tablename__ = "example_shipment"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[str]
    booking_reference: Mapped[str]


class OrderPlaced(pydantic.BaseModel):
    """The fields this consumer needs; extra fields in the payload are ignored."""

    order_id: str
    customer: str


registry = EventRegistry()


@registry.handler(OrderPlaced, event_type="order.placed")
def book_shipment(event: OrderPlaced, ctx: HandlerContext, session: Session) -> None:
    # Calling a carrier's API? Pass ctx.idempotency_key: it is the same on every redelivery.
    session.add(Shipment(order_id=event.order_id, booking_reference=ctx.idempotency_key))


def consume(inbox: Inbox, kafka: KafkaSettings, expected: int | None) -> Counter[str]:
    """Read the topic from the start under a new group: ``expected`` records, or until none
    came for a while (joining the group takes a few seconds, hence more patience at first)."""
    outcomes: Counter[str] = Counter()
    group_id = f"shipping-{uuid.uuid4().hex[:6]}"
    # A new group starts at the earliest offset; config={...} takes librdkafka properties.
    with ConfluentInboxConsumer(inbox, kafka, group_id=group_id, topics=[TOPIC]) as consumer:
        idle_since = time.monotonic()
        while sum(outcomes.values()) != expected:
            if time.monotonic() - idle_since > (5.0 if outcomes else 30.0):
                break
            outcome = consumer.poll_once(timeout=0.5)
            if outcome is not None:
                outcomes[outcome.kind.value] += 1
                idle_since = time.monotonic()
    return outcomes


def shipments(engine: Engine) -> dict[str, int]:
    with Session(engine) as session:
        rows = session.execute(
            select(Shipment.order_id, func.count()).group_by(Shipment.order_id)
        ).all()
    return dict(rows)


def main(
    database_url: str, kafka: KafkaSettings, expected: int | None = None
) -> tuple[list[Counter[str]], dict[str, int]]:
    """Outcomes of both passes, and shipments per order (one each)."""
    engine = create_engine(make_url(database_url).set(drivername="postgresql+psycopg"))
    try:
        Base.metadata.create_all(engine)
        inbox = Inbox(engine, InboxSettings(consumer="shipping", registry=registry))
        first = consume(inbox, kafka, expected)
        second = consume(inbox, kafka, expected)  # everything again: all duplicates
        return [first, second], shipments(engine)
    finally:
        engine.dispose()


if __name__ == "__main__":
    # [kafka] from OUTBOXKIT_CONFIG, OUTBOXKIT_KAFKA_*, the secrets dir (security: example 08).
    passes, per_order = main(os.environ["OUTBOXKIT_DATABASE_URL"], load_kafka_settings())
    for number, outcomes in enumerate(passes, 1):
        print(f"pass {number}: {dict(outcomes)}")
    print(f"shipments per order: {per_order}")
    sys.exit(0 if per_order and set(per_order.values()) == {1} else 1)
