"""Example: an asyncio service end to end.

* entities record domain events; a flush hook writes them to the outbox in the same unit of work
  (SQLAlchemy ``AsyncSession``);
* the relay publishes them at-least-once (Kafka transactions off);
* an aiokafka consumer with the dedup middleware applies each event's effect once, even though
  at-least-once publishing may deliver an event twice.

Run it against running services::

    eval $(outboxkit dev env)          # after `outboxkit dev up` in another shell
    python examples/async_payments.py

It is also run by the test suite (``tests/integration/test_examples.py``).
"""

from __future__ import annotations

import asyncio
import os
import uuid

import sqlalchemy as sa
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit import DomainEvents, Event, FlushHook
from outboxkit.db import migrator, sqlalchemy_url
from outboxkit.inbox import AsyncInbox, EventRegistry, HandlerContext, InboxSettings
from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer
from outboxkit.relay import Relay
from outboxkit.settings import KafkaSettings, Mode, load_settings

TOPIC = "example.payments"


class Base(DeclarativeBase):
    pass


class PaymentCaptured(Event, topic=TOPIC, key="payment_id", aggregate_type="payment"):
    payment_id: str
    amount_cents: int


class Payment(Base, DomainEvents):
    __tablename__ = "example_payment"
    id: Mapped[str] = mapped_column(primary_key=True)
    amount_cents: Mapped[int]
    status: Mapped[str] = mapped_column(default="authorised")

    def capture(self) -> None:
        self.status = "captured"
        self.record_event(PaymentCaptured(payment_id=self.id, amount_cents=self.amount_cents))


class Receipt(Base):
    """The consumer's effect; no unique constraint, so only the inbox prevents doubles."""

    __tablename__ = "example_receipt"
    id: Mapped[int] = mapped_column(sa.Identity(), primary_key=True)
    payment_id: Mapped[str]
    idempotency_key: Mapped[str]


async def write_payments(url: str, count: int) -> None:
    engine = create_async_engine(sqlalchemy_url(url))
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    for number in range(count):
        async with AsyncSession(engine) as session:
            hook = FlushHook().install(session.sync_session)
            async with session.begin():
                payment = Payment(id=f"pay-{number}", amount_cents=500 + number)
                session.add(payment)
                payment.capture()
            hook.remove()
    await engine.dispose()


async def relay_until_drained(url: str, bootstrap: str) -> None:
    config = load_settings(
        overrides={
            "database": {"url": url},
            "kafka": {"bootstrap": bootstrap},
            "relay": {"mode": Mode.AT_LEAST_ONCE, "poll_interval": 0.5},
        }
    )
    stop = asyncio.Event()
    task = asyncio.create_task(Relay(config, stop=stop).run())
    engine = create_async_engine(sqlalchemy_url(url))
    try:
        for _ in range(600):
            async with engine.connect() as conn:
                pending = await conn.scalar(
                    sa.text("SELECT count(*) FROM outboxkit.outbox_message WHERE state='pending'")
                )
            if pending == 0:
                return
            if task.done():
                task.result()
            await asyncio.sleep(0.1)
        raise RuntimeError("relay did not drain the outbox")
    finally:
        stop.set()
        await task
        await engine.dispose()


async def consume(url: str, bootstrap: str, expected: int) -> dict[str, int]:
    registry = EventRegistry()

    @registry.handler(PaymentCaptured)  # the event type comes from the class
    async def issue_receipt(
        event: PaymentCaptured, ctx: HandlerContext, session: AsyncSession
    ) -> None:
        # ctx.idempotency_key is what you would pass to an external API (payments, e-mail).
        session.add(Receipt(payment_id=event.payment_id, idempotency_key=ctx.idempotency_key))

    engine = create_async_engine(sqlalchemy_url(url))
    inbox = AsyncInbox(engine, InboxSettings(consumer="receipts", registry=registry))
    consumer = AiokafkaInboxConsumer(
        inbox,
        KafkaSettings(bootstrap=bootstrap),  # or KafkaSettings() from OUTBOXKIT_KAFKA_*
        group_id=f"receipts-{uuid.uuid4().hex[:6]}",
        topics=[TOPIC],
    )
    try:
        async with consumer:
            await asyncio.wait_for(consumer.run(max_messages=expected), timeout=120)
        async with engine.connect() as conn:
            rows = await conn.execute(
                sa.select(Receipt.payment_id, sa.func.count()).group_by(Receipt.payment_id)
            )
            return {payment: int(n) for payment, n in rows}
    finally:
        await engine.dispose()


def create_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [NewTopic(TOPIC, num_partitions=2), NewTopic(f"{TOPIC}.dlq", num_partitions=1)]
    for future in admin.create_topics(topics).values():
        try:
            future.result(timeout=30)
        except Exception as exc:
            if "already exists" not in str(exc).lower():
                raise


async def main(url: str, bootstrap: str, count: int = 10) -> dict[str, int]:
    """Returns receipts per payment: exactly one each."""
    migrator.upgrade(url)
    create_topic(bootstrap)
    await write_payments(url, count)
    await relay_until_drained(url, bootstrap)
    return await consume(url, bootstrap, expected=count)


if __name__ == "__main__":
    receipts = asyncio.run(
        main(os.environ["OUTBOXKIT_DATABASE_URL"], os.environ["OUTBOXKIT_KAFKA_BOOTSTRAP"])
    )
    print(f"receipts per payment: {receipts}")
