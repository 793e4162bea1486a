"""A stop caught by the application (a cancelled or timed-out poll, a ``KeyboardInterrupt``)
and the same consumer polled again: the records the stop cut short come first, and run.

Before, they were taken out of the consumer's buffer and never put back: the client was
already past them, so the next polls processed the records behind them, and the offsets
committed for those went past records that never ran (their rows stayed ``processing``, their
effects never happened, and no restart delivered them again).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from outboxkit.inbox import HandlerContext, Inbox, InboxSettings
from outboxkit.inbox.confluent import ConfluentInboxConsumer
from outboxkit.settings import KafkaSettings
from tests.integration.inbox_support import (
    EFFECT_DDL,
    INSERT_EFFECT,
    REGISTRY,
    PaymentRequested,
    billing_aiokafka_consumer,
    effects,
    inbox_row,
    produce_events,
)

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
DEADLINE = 60.0


def _all_succeeded(db_url: str, event_ids: list[str]) -> bool:
    rows = [inbox_row(db_url, "billing", e) for e in event_ids]
    return all(row is not None and row["state"] == "succeeded" for row in rows)


def _each_effect_once(db_url: str, event_ids: list[str]) -> None:
    for event_id in event_ids:
        assert len(effects(db_url, event_id)) == 1, event_id


def _options(batch: int) -> dict[str, Any]:
    return {"batch_max_records": batch, "batch_max_ms": 2000.0 if batch > 1 else 5.0}


def _poll_until_stopped(consumer: ConfluentInboxConsumer) -> None:
    for _ in range(200):
        consumer.poll_batch(0.2)


@pytest.mark.parametrize("batch", [1, 5])
def test_a_sync_consumer_polled_again_after_a_keyboard_interrupt_runs_the_cut_records(
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    batch: int,
) -> None:
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    topic = outboxkit_topic()
    first = produce_events(outboxkit_kafka_bootstrap, topic, 5)
    engine = create_engine(sa_url)
    runs: list[tuple[str, int]] = []

    def handle(event: PaymentRequested, ctx: HandlerContext, session: Session) -> None:
        params = {"order_id": event.order_id, "amount": event.amount, "attempt": ctx.attempt}
        session.execute(INSERT_EFFECT, {"event_id": ctx.event_id, **params})
        runs.append((ctx.event_id, ctx.attempt))
        if len(runs) == 1:
            raise KeyboardInterrupt  # Ctrl-C while the first record's handler runs

    consumer = ConfluentInboxConsumer(
        Inbox(engine, handle, InboxSettings(consumer="billing", registry=REGISTRY)),
        KafkaSettings(bootstrap=outboxkit_kafka_bootstrap),
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        topics=[topic],
        dead_letter=None,
        **_options(batch),
    )
    try:
        with consumer:
            with pytest.raises(KeyboardInterrupt):
                _poll_until_stopped(consumer)
            later = produce_events(outboxkit_kafka_bootstrap, topic, 2)
            for _ in range(400):
                if _all_succeeded(outboxkit_db_url, first + later):
                    break
                consumer.poll_batch(0.2)
    finally:
        engine.dispose()
    assert _all_succeeded(outboxkit_db_url, first + later)
    _each_effect_once(outboxkit_db_url, first + later)
    assert runs[:2] == [(first[0], 1), (first[0], 2)]  # the cut record came first


@pytest.mark.parametrize("batch", [1, 5])
def test_an_async_consumer_polled_again_after_a_cancelled_poll_runs_the_cut_records(
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    batch: int,
) -> None:
    """A poll's task cancelled (as ``asyncio.timeout`` around it does), and the consumer
    polled again."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    topic = outboxkit_topic()
    first = produce_events(outboxkit_kafka_bootstrap, topic, 5)

    async def main() -> list[str]:
        engine = create_async_engine(sa_url)
        reached, runs = asyncio.Event(), list[str]()

        async def handle(event: PaymentRequested, ctx: HandlerContext, session: Any) -> None:
            params = {"order_id": event.order_id, "amount": event.amount, "attempt": 1}
            await session.execute(INSERT_EFFECT, {"event_id": ctx.event_id, **params})
            runs.append(ctx.event_id)
            if not reached.is_set():
                reached.set()
                await asyncio.Event().wait()  # until the poll is cancelled

        consumer = billing_aiokafka_consumer(
            engine, handle, outboxkit_kafka_bootstrap, topic, **_options(batch)
        )
        try:
            async with consumer:

                async def until_cancelled() -> None:
                    while True:
                        await consumer.poll_batch(0.2)

                polling = asyncio.create_task(until_cancelled())
                await asyncio.wait_for(reached.wait(), DEADLINE)
                polling.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await polling
                later = await asyncio.to_thread(produce_events, outboxkit_kafka_bootstrap, topic, 2)
                for _ in range(400):
                    if await asyncio.to_thread(_all_succeeded, outboxkit_db_url, first + later):
                        break
                    await consumer.poll_batch(0.2)
        finally:
            await engine.dispose()
        assert _all_succeeded(outboxkit_db_url, first + later)
        _each_effect_once(outboxkit_db_url, first + later)
        return runs

    runs = asyncio.run(main())
    assert runs[:2] == [first[0], first[0]]  # the cut record came first
