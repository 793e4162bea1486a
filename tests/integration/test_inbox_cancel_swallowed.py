"""The consumer's task cancelled while a handler swallows the ``CancelledError`` (``except
CancelledError: pass``, or raising an error of its own instead): the consumer stops all the
same once the handler ends, as for a cancellation the handler let through (its run counts,
its writes are rolled back).

Before, the cancellation was lost: the task went on processing records until something else
stopped it, so a shutdown that cancels tasks and awaits them hung.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from outboxkit.inbox import HandlerContext
from tests.integration.inbox_support import (
    EFFECT_DDL,
    INSERT_EFFECT,
    PaymentRequested,
    billing_aiokafka_consumer,
    effects,
    inbox_row,
    produce_events,
)

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]


class HandlerError(Exception):
    """What a handler raises instead of the cancellation it caught."""


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("instead", ["returns", "raises its own error"])
def test_a_cancellation_the_handler_swallows_still_stops_the_consumer(
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    batch: int,
    instead: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    topic = outboxkit_topic()
    event_ids = produce_events(outboxkit_kafka_bootstrap, topic, 3)

    async def main() -> list[str]:
        engine = create_async_engine(sa_url)
        reached, runs = asyncio.Event(), list[str]()

        async def handle(event: PaymentRequested, ctx: HandlerContext, session: Any) -> None:
            params = {"order_id": event.order_id, "amount": event.amount, "attempt": 1}
            await session.execute(INSERT_EFFECT, {"event_id": ctx.event_id, **params})
            runs.append(ctx.event_id)
            if not reached.is_set():
                reached.set()
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError as exc:
                    if instead == "raises its own error":
                        raise HandlerError("interrupted") from exc
                    # else returns as if all went well

        consumer = billing_aiokafka_consumer(
            engine,
            handle,
            outboxkit_kafka_bootstrap,
            topic,
            batch_max_records=batch,
            batch_max_ms=2000.0,
        )
        try:
            async with consumer:

                async def consume() -> None:
                    while True:
                        await consumer.poll_batch(0.2)

                task = asyncio.create_task(consume())
                await asyncio.wait_for(reached.wait(), 60)
                task.cancel()
                done, _ = await asyncio.wait([task], timeout=30)
                assert done, "the cancelled consumer went on"
                assert task.cancelled()
                assert runs == event_ids[:1]  # nothing ran after the cancellation
                row = await asyncio.to_thread(inbox_row, outboxkit_db_url, "billing", runs[0])
                assert row is not None
                assert (row["state"], row["attempts"]) == ("processing", 1)  # its run counted
                assert await asyncio.to_thread(effects, outboxkit_db_url) == []  # rolled back
        finally:
            await engine.dispose()
        return runs

    asyncio.run(main())
    said = "raised HandlerError: interrupted instead: taken as the stop"
    assert (said in caplog.text) == (instead == "raises its own error")
