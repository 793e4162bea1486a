"""Example 09: a batch handler — one call per batch for bulk effects (aiokafka, asyncio).

The revenue service books every ``order.placed`` event: one ledger line per order, and a running
total per customer. A per-event handler would update a customer's total row once per order; the
batch handler gets all the events of a batch at once, writes the ledger lines in one statement
and each customer's total once. The ledger refuses orders of 0 cents (a CHECK constraint): the
bulk call fails, is rolled back, and the batch calls the handler again once per event, so the
free order goes ``dead`` alone and the others are booked once.

    eval $(outboxkit dev env) && outboxkit migrate up
    python examples/02_sync_script/place_orders.py       # write orders (one of them 0 cents)
    python examples/07_embedded_relay/embedded_relay.py   # publish them (or `outboxkit relay run`)
    python examples/09_batch_handler/revenue_consumer.py
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import pydantic
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from outboxkit.inbox import AsyncInbox, BatchContext, EventRegistry, InboxSettings, RetryPolicy
from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer
from outboxkit.settings import KafkaSettings, load_kafka_settings

TOPIC = os.environ.get("EXAMPLE_TOPIC", "example.orders")

TABLES = [
    "CREATE TABLE IF NOT EXISTS example_revenue_line ("
    " order_id text PRIMARY KEY, customer text NOT NULL,"
    " cents integer NOT NULL CHECK (cents > 0))",
    "CREATE TABLE IF NOT EXISTS example_customer_revenue ("
    " customer text PRIMARY KEY, orders integer NOT NULL, cents bigint NOT NULL)",
]
BOOK_LINES = text(
    "INSERT INTO example_revenue_line (order_id, customer, cents)"
    " SELECT * FROM unnest(CAST(:orders AS text[]), CAST(:customers AS text[]),"
    " CAST(:cents AS integer[]))"
)
ADD_TO_TOTAL = text(
    "INSERT INTO example_customer_revenue (customer, orders, cents) VALUES (:c, :n, :cents)"
    " ON CONFLICT (customer) DO UPDATE SET orders = example_customer_revenue.orders + :n,"
    " cents = example_customer_revenue.cents + :cents"
)


class OrderPlaced(pydantic.BaseModel):
    """The fields this consumer needs; extra fields in the payload are ignored."""

    order_id: str
    customer: str
    total_cents: int


registry = EventRegistry()
calls: list[int] = []  # how many events each call got (shown by the script)


@registry.batch_handler(OrderPlaced, event_type="order.placed")
async def book_revenue(
    events: Sequence[OrderPlaced], ctx: BatchContext, session: AsyncSession
) -> None:
    """All events of a batch at once (in fetch order; ``ctx[i]`` is event i's id, offset,
    attempt...). Runs in the batch's transaction, without a savepoint at first (in one of its
    own if the batch runs again after a failure); never commit the session."""
    calls.append(len(events))
    await session.execute(
        BOOK_LINES,
        {
            "orders": [e.order_id for e in events],
            "customers": [e.customer for e in events],
            "cents": [e.total_cents for e in events],
        },
    )
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for event in events:
        totals[event.customer][0] += 1
        totals[event.customer][1] += event.total_cents
    for customer, (count, cents) in sorted(totals.items()):  # one update per customer
        await session.execute(ADD_TO_TOTAL, {"c": customer, "n": count, "cents": cents})


@dataclass
class Report:
    outcomes: Counter[str]
    call_sizes: list[int]
    revenue: dict[str, tuple[int, int]]  # customer -> (orders, cents)
    lines: set[str] = field(default_factory=set)  # the orders booked


async def consume(inbox: AsyncInbox, kafka: KafkaSettings, expected: int | None) -> Counter[str]:
    """Read the topic from the start under a new group: ``expected`` settled records, or until
    none came for a while (joining the group takes a few seconds, hence more patience first)."""
    outcomes: Counter[str] = Counter()
    group_id = f"revenue-{uuid.uuid4().hex[:6]}"
    async with AiokafkaInboxConsumer(
        inbox,
        kafka,
        group_id=group_id,
        topics=[TOPIC],
        dead_letter=None,  # a real service names a dead-letter topic ("{topic}.dlq")
        batch_max_records=50,  # the default: up to 50 events per call
        batch_max_ms=200.0,  # wait this long for a batch to fill after its first record
    ) as consumer:
        idle_since = time.monotonic()
        while sum(outcomes.values()) != expected:
            if time.monotonic() - idle_since > (5.0 if outcomes else 30.0):
                break
            settled = [o for o in await consumer.poll_batch(0.5) if o.kind.advances_offset]
            outcomes.update(o.kind.value for o in settled)
            if settled:
                idle_since = time.monotonic()
    return outcomes


async def read_back(engine: AsyncEngine) -> tuple[dict[str, tuple[int, int]], set[str]]:
    async with engine.connect() as conn:
        totals = await conn.execute(text("SELECT * FROM example_customer_revenue"))
        lines = await conn.execute(text("SELECT order_id FROM example_revenue_line"))
        return {c: (int(n), int(cents)) for c, n, cents in totals}, {r[0] for r in lines}


async def main(database_url: str, kafka: KafkaSettings, expected: int | None = None) -> Report:
    """Book the topic's orders; what happened, per call and in the tables."""
    url = make_url(database_url).set(drivername="postgresql+psycopg")
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            for ddl in TABLES:
                await conn.execute(text(ddl))
        settings = InboxSettings(
            consumer="revenue",
            registry=registry,
            policy=RetryPolicy(max_attempts=2, initial_delay=0.1),
        )
        calls.clear()
        outcomes = await consume(AsyncInbox(engine, settings), kafka, expected)
        revenue, lines = await read_back(engine)
        return Report(outcomes, list(calls), revenue, lines)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    # [kafka] from OUTBOXKIT_CONFIG, OUTBOXKIT_KAFKA_*, the secrets dir (security: example 08).
    report = asyncio.run(main(os.environ["OUTBOXKIT_DATABASE_URL"], load_kafka_settings()))
    print(f"outcomes: {dict(report.outcomes)}")
    print(f"events per handler call: {report.call_sizes}")
    print(f"revenue per customer (orders, cents): {report.revenue}")
