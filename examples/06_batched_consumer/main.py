"""Example: a batched exactly-once consumer (confluent-kafka, sync handlers).

* an order service writes ``OrderPlaced`` events to the outbox in its own transactions;
* the relay publishes them (at-least-once here, so a duplicate may reach the consumer);
* the consumer takes up to ``batch_max_records`` records at a time: one claim statement, one
  transaction in which the handlers run one after the other without savepoints. One order's
  handler fails (a bad SKU): that transaction rolls back and the batch runs again with a
  savepoint per handler, the failed order left out, so the rest of the batch commits (their
  writes once) and the bad order goes dead alone after its attempts.

Run it against running services::

    . .venv/bin/activate
    eval $(outboxkit dev env)          # after `outboxkit dev up` in another shell
    python examples/06_batched_consumer/main.py

It is also run by the test suite (``tests/integration/test_example_batched_consumer.py``).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import sqlalchemy as sa
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from sqlalchemy.orm import Session

from outboxkit import Event, Outbox
from outboxkit.db import migrator, sqlalchemy_url
from outboxkit.inbox import EventRegistry, HandlerContext, Inbox, InboxSettings, RetryPolicy
from outboxkit.inbox.confluent import ConfluentInboxConsumer
from outboxkit.relay import Relay
from outboxkit.settings import KafkaSettings, Mode, load_settings

TOPIC = f"example.orders.{uuid.uuid4().hex[:6]}"
BAD_SKU = "sku-broken"
CONSUMER = "batched-shipping"  # its own dedup rows, apart from example 04's "shipping"


class OrderPlaced(Event, topic=TOPIC, key="order_id"):
    order_id: str
    sku: str
    quantity: int


# Its own table (example 04 has an example_shipment of other columns); the topic tells this
# run's rows from those of earlier runs on the same database.
SHIPMENTS = sa.text(
    "CREATE TABLE IF NOT EXISTS example_batched_shipment ("
    " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text NOT NULL,"
    " order_id text NOT NULL, sku text NOT NULL, quantity integer NOT NULL)"
)
SHIP = sa.text(
    "INSERT INTO example_batched_shipment (topic, order_id, sku, quantity) VALUES (:t, :o, :s, :q)"
)


def create_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, 2, 1)]).values():
        future.result(60)


def place_orders(engine: sa.Engine, count: int) -> list[str]:
    outbox, ids = Outbox(), []
    for number in range(count):
        order_id = f"order-{uuid.uuid4().hex[:8]}"
        sku = BAD_SKU if number == count // 2 else f"sku-{number % 3}"
        with Session(engine) as session, session.begin():
            outbox.add(session, OrderPlaced(order_id=order_id, sku=sku, quantity=number + 1))
        ids.append(order_id)
    return ids


def relay_until_drained(url: str, bootstrap: str, engine: sa.Engine) -> None:
    config = load_settings(
        overrides={
            "database": {"url": url},
            "kafka": {"bootstrap": bootstrap},
            "relay": {"mode": Mode.AT_LEAST_ONCE, "poll_interval": 0.5},
        }
    )
    # This run's rows only: rows of other topics pending on the same database are no concern.
    pending = sa.text(
        "SELECT count(*) FROM outboxkit.outbox_message WHERE state = 'pending' AND topic = :t"
    ).bindparams(t=TOPIC)

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(Relay(config, stop=stop).run())
        try:
            for _ in range(600):
                with engine.connect() as conn:
                    if conn.scalar(pending) == 0:
                        return
                if task.done():
                    task.result()
                await asyncio.sleep(0.1)
            raise RuntimeError("relay did not drain the outbox")
        finally:
            stop.set()
            await task

    asyncio.run(run())


def consume(engine: sa.Engine, bootstrap: str, expected: int) -> dict[str, int]:
    registry = EventRegistry()

    @registry.handler(OrderPlaced)
    def ship(event: OrderPlaced, ctx: HandlerContext, session: Session) -> None:
        # Runs in the batch's transaction, first without a savepoint; after a failure the batch
        # runs again with a savepoint per handler, so an exception costs this event only.
        # Never commit the session: the middleware commits the batch.
        params = {"t": ctx.topic, "o": event.order_id, "s": event.sku, "q": event.quantity}
        session.execute(SHIP, params)
        if event.sku == BAD_SKU:
            raise ValueError(f"unknown SKU {event.sku!r}")

    settings = InboxSettings(
        consumer=CONSUMER,
        registry=registry,
        policy=RetryPolicy(max_attempts=2, initial_delay=0.1),
    )
    consumer = ConfluentInboxConsumer(
        Inbox(engine, settings),
        KafkaSettings(bootstrap=bootstrap),  # or KafkaSettings() from OUTBOXKIT_KAFKA_*
        group_id=f"shipping-{uuid.uuid4().hex[:6]}",
        topics=[TOPIC],
        dead_letter=None,  # a real service names a dead-letter topic ("{topic}.dlq")
        offset_commit_interval=1.0,
        batch_max_records=50,  # the default; 1 turns batching off
        batch_max_ms=50.0,  # wait this long for a batch to fill after its first record
    )
    settled, deadline = 0, time.monotonic() + 120
    with consumer:
        while settled < expected and time.monotonic() < deadline:
            outcomes = consumer.poll_batch()  # consumer.run(stop_event) in a real service
            settled += sum(o.kind.advances_offset for o in outcomes)
    with engine.connect() as conn:
        states = conn.execute(
            sa.text(
                "SELECT state, count(*) FROM outboxkit.inbox_message"
                " WHERE consumer = :c AND topic = :t GROUP BY state"
            ),
            {"c": CONSUMER, "t": TOPIC},
        )
        return {state: int(n) for state, n in states}


def shipments(engine: sa.Engine) -> dict[str, int]:
    """This run's shipment rows per order: one each, except none for the order that went dead."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT order_id, count(*) FROM example_batched_shipment WHERE topic = :t"
                " GROUP BY 1"
            ),
            {"t": TOPIC},
        )
        return {order_id: int(n) for order_id, n in rows}


def main(url: str, bootstrap: str, count: int = 20) -> dict[str, int]:
    """Place ``count`` orders, publish and consume them; the inbox states by count."""
    migrator.upgrade(url)
    engine = sa.create_engine(sqlalchemy_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(SHIPMENTS)
        create_topic(bootstrap)
        place_orders(engine, count)
        relay_until_drained(url, bootstrap, engine)
        return consume(engine, bootstrap, count)
    finally:
        engine.dispose()


if __name__ == "__main__":
    print(main(os.environ["OUTBOXKIT_DATABASE_URL"], os.environ["OUTBOXKIT_KAFKA_BOOTSTRAP"]))
