"""The end-to-end demo: write -> relay -> Kafka -> deduplicating consumer, with its invariants.

``outboxkit demo`` runs it on a self-started PostgreSQL + Kafka. It is also a test
(``tests/integration/test_demo.py``): every claim it prints is checked, and a broken invariant
raises :class:`DemoInvariantError` instead of printing a happy summary.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.orm import Session

from outboxkit import db
from outboxkit.errors import IdempotencyKeyConflictError, OutboxkitError
from outboxkit.events import Event
from outboxkit.inbox import EventRegistry, HandlerContext, Inbox, InboxSettings
from outboxkit.inbox.confluent import ConfluentInboxConsumer
from outboxkit.inbox.readback import stats
from outboxkit.kafka import KafkaClients
from outboxkit.outbox import Outbox
from outboxkit.relay import Relay
from outboxkit.schema import DEFAULT_SCHEMA, OutboxState
from outboxkit.settings import KafkaSettings, Mode, Settings, load_settings
from outboxkit.testing import outboxed
from outboxkit.wire import (
    HEADER_CONTENT_TYPE,
    HEADER_EVENT_ID,
    HEADER_EVENT_TYPE,
    HEADER_IDEMPOTENCY_KEY,
)

Echo = Callable[[str], None]

_APP_SCHEMA = sa.MetaData()
demo_order = sa.Table(
    "demo_order",
    _APP_SCHEMA,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("customer", sa.Text, nullable=False),
    sa.Column("amount_cents", sa.Integer, nullable=False),
)
# The consumer's effect. Deliberately no unique constraint: only the inbox prevents doubles.
demo_ledger = sa.Table(
    "demo_ledger",
    _APP_SCHEMA,
    sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
    sa.Column("order_id", sa.Integer, nullable=False),
    sa.Column("event_id", sa.Text, nullable=False),
)


class DemoInvariantError(OutboxkitError):
    """The demo observed a broken guarantee."""


class OrderPlaced(Event, topic="demo.orders", key="customer", aggregate_type="order"):
    order_id: int
    customer: str
    amount_cents: int

    def outbox_idempotency_key(self) -> str:
        return f"order-placed:{self.order_id}"


@dataclass
class DemoReport:
    orders_committed: int = 0
    events_written: int = 0
    rolled_back_events_published: int = 0
    duplicate_writes_recognised: int = 0
    conflicting_writes_rejected: int = 0
    relay_seconds: float = 0.0
    duplicates_injected: int = 0
    consumer_outcomes: dict[str, int] = field(default_factory=dict)
    consumer_duplicates_skipped: int = 0
    ledger_rows: int = 0
    orders_applied_once: int = 0


def _create_topic(kafka: KafkaClients, topic: str, partitions: int) -> None:
    async def create() -> None:
        admin = kafka.admin()
        try:
            await admin.create_topic(topic, partitions, {})
        finally:
            await admin.close()

    asyncio.run(create())


def _write_orders(engine: sa.Engine, outbox: Outbox, count: int, report: DemoReport) -> None:
    customers = ["ada", "grace", "edsger", "barbara"]
    for order_id in range(1, count + 1):
        event = OrderPlaced(
            order_id=order_id, customer=customers[order_id % 4], amount_cents=100 * order_id
        )
        with Session(engine) as session, session.begin():
            session.execute(
                demo_order.insert().values(
                    id=order_id, customer=event.customer, amount_cents=event.amount_cents
                )
            )
            outbox.add(session, event)
        report.orders_committed += 1
        report.events_written += 1

    # A failed business transaction: its event must never be published.
    with Session(engine) as session:
        session.begin()
        outbox.add(session, OrderPlaced(order_id=9999, customer="ghost", amount_cents=1))
        session.rollback()

    # A client retry of order 1 (same key, same content): recognised, nothing new written.
    first = OrderPlaced(order_id=1, customer=customers[1], amount_cents=100)
    with Session(engine) as session, session.begin():
        if outbox.add(session, first).duplicate:
            report.duplicate_writes_recognised += 1

    # The same key with other content: refused with a specific error.
    tampered = OrderPlaced(order_id=1, customer=customers[1], amount_cents=999_999)
    try:
        with Session(engine) as session, session.begin():
            outbox.add(session, tampered)
    except IdempotencyKeyConflictError:
        report.conflicting_writes_rejected += 1


def _pending(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        counts = db.rows(conn, db.query("outbox", "state_counts", DEFAULT_SCHEMA))
    return sum(int(count) for state, count in counts if state == OutboxState.PENDING)


def _relay_until_drained(config: Settings, engine: sa.Engine, timeout: float) -> float:
    async def main() -> float:
        stop = asyncio.Event()
        relay = Relay(config, stop=stop)
        task = asyncio.create_task(relay.run())
        started = time.monotonic()
        try:
            while time.monotonic() - started < timeout:
                if task.done():
                    task.result()  # surfaces the relay's error
                if await asyncio.to_thread(_pending, engine) == 0:
                    return time.monotonic() - started
                await asyncio.sleep(0.1)
            raise DemoInvariantError(f"the relay did not drain the outbox in {timeout:.0f}s")
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=60)

    return asyncio.run(main())


def _inject_relay_duplicate(engine: sa.Engine, kafka: KafkaClients) -> None:
    """Publish one already-published row again, as an at-least-once relay may after a crash."""
    with engine.connect() as conn:
        row = outboxed(conn)[0]
    sender = kafka.record_sender()
    try:
        sender.send(
            row.topic,
            row.key.encode() if row.key is not None else None,
            row.payload,
            [
                (HEADER_EVENT_ID, str(row.event_id).encode()),
                (HEADER_IDEMPOTENCY_KEY, row.idempotency_key.encode()),
                (HEADER_EVENT_TYPE, (row.event_type or "").encode()),
                (HEADER_CONTENT_TYPE, row.content_type.encode()),
            ],
        )
    except OutboxkitError as exc:
        raise DemoInvariantError(f"could not publish the injected duplicate: {exc}") from exc
    finally:
        sender.close()


def _consume(engine: sa.Engine, bootstrap: str, expected: int, timeout: float) -> None:
    registry = EventRegistry()
    registry.register(OrderPlaced)

    def ship(event: OrderPlaced, ctx: HandlerContext, session: Session) -> None:
        # The effect, in the same transaction as the inbox row.
        session.execute(demo_ledger.insert().values(order_id=event.order_id, event_id=ctx.event_id))

    inbox = Inbox(engine, ship, InboxSettings(consumer="shipping", registry=registry))
    consumer = ConfluentInboxConsumer(
        inbox,
        KafkaSettings(bootstrap=bootstrap),
        group_id=f"demo-shipping-{uuid.uuid4().hex[:8]}",
        topics=[OrderPlaced.outbox_spec().topic],
    )
    stop = threading.Event()
    timer = threading.Timer(timeout, stop.set)
    timer.start()
    try:
        with consumer:
            settled = consumer.run(stop=stop, max_messages=expected)
    finally:
        timer.cancel()
    if settled < expected:
        raise DemoInvariantError(f"the consumer settled {settled} of {expected} deliveries")


def run_demo(
    database_url: str, kafka_bootstrap: str, *, orders: int = 20, echo: Echo = print
) -> DemoReport:
    """Run every step against the given services and check the invariants."""
    report = DemoReport()
    engine = sa.create_engine(db.sqlalchemy_url(database_url))
    kafka = KafkaClients(KafkaSettings(bootstrap=kafka_bootstrap))
    try:
        applied = db.migrator.upgrade(database_url)
        echo(f"1. schema: applied migrations {applied or 'none (already current)'}")
        _APP_SCHEMA.drop_all(engine)
        _APP_SCHEMA.create_all(engine)
        _create_topic(kafka, OrderPlaced.outbox_spec().topic, partitions=3)
        _create_topic(kafka, f"{OrderPlaced.outbox_spec().topic}.dlq", partitions=1)

        _write_orders(engine, Outbox(), orders, report)
        echo(
            f"2. writes: {report.orders_committed} orders, each with its OrderPlaced event in the"
            f" same transaction; 1 rolled back; retry recognised as duplicate:"
            f" {report.duplicate_writes_recognised}; key reused with other content rejected:"
            f" {report.conflicting_writes_rejected}"
        )

        config = load_settings(
            overrides={
                "database": {"url": database_url},
                "kafka": {"bootstrap": kafka_bootstrap},
                "relay": {"mode": Mode.EXACTLY_ONCE, "poll_interval": 0.5, "lease_ttl": 10},
            }
        )
        report.relay_seconds = _relay_until_drained(config, engine, timeout=120)
        echo(
            f"3. relay: published {report.events_written} events exactly once into Kafka"
            f" (fenced lease, Kafka transaction + checkpoint) in {report.relay_seconds:.2f}s"
        )

        _inject_relay_duplicate(engine, kafka)
        report.duplicates_injected = 1
        echo("4. chaos: published one event a second time, as a crashed at-least-once relay may")

        _consume(engine, kafka_bootstrap, expected=orders + 1, timeout=120)
        for row in stats(engine):
            if row.consumer == "shipping":
                report.consumer_outcomes[row.state] = row.events
                report.consumer_duplicates_skipped += row.duplicates
        with engine.connect() as conn:
            per_order = conn.execute(
                sa.select(demo_ledger.c.order_id, sa.func.count()).group_by(demo_ledger.c.order_id)
            ).all()
        report.ledger_rows = sum(count for _, count in per_order)
        report.orders_applied_once = sum(1 for _, count in per_order if count == 1)
        report.rolled_back_events_published = sum(1 for order, _ in per_order if order == 9999)
        echo(
            f"5. consumer: outcomes {report.consumer_outcomes}, duplicates skipped"
            f" {report.consumer_duplicates_skipped}; ledger rows {report.ledger_rows} for"
            f" {orders} orders"
        )
    finally:
        engine.dispose()
    _check(report, orders)
    echo("OK: every order's effect happened exactly once; nothing lost, nothing phantom.")
    return report


def _check(report: DemoReport, orders: int) -> None:
    problems = []
    if report.duplicate_writes_recognised != 1 or report.conflicting_writes_rejected != 1:
        problems.append("idempotent writes misbehaved")
    if report.rolled_back_events_published:
        problems.append("an event of a rolled-back transaction reached the consumer")
    if report.consumer_outcomes.get("succeeded") != orders:
        problems.append(f"expected {orders} succeeded events, got {report.consumer_outcomes}")
    if report.consumer_duplicates_skipped < report.duplicates_injected:
        problems.append("the injected duplicate was not recognised")
    if report.ledger_rows != orders or report.orders_applied_once != orders:
        problems.append(f"{report.ledger_rows} ledger rows for {orders} orders")
    if problems:
        raise DemoInvariantError("; ".join(problems), report=report)
