"""Handlers that raise what the consumer must still settle, on the real stack over both drivers:
an exception whose ``str()`` raises (retried by the policy, then dead with a dead-letter record),
and an ``asyncio.CancelledError`` of the handler's own (a failure to retry, not a stop), while
cancelling the consumer's own task still stops it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outboxkit.inbox import (
    AsyncInbox,
    EventRegistry,
    HandlerContext,
    InboxSettings,
    OutcomeKind,
    RetryPolicy,
)
from outboxkit.settings import KafkaSettings
from tests.integration.inbox_support import (
    EFFECT_DDL,
    INSERT_EFFECT,
    Behaviour,
    Harness,
    PaymentRequested,
    effects,
    fetch,
    inbox_row,
    produce_event,
)
from tests.integration.test_inbox_conformance import adapter, start  # noqa: F401
from tests.support.topics import read_topic

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
Start = Callable[..., Harness]
UNPRINTABLE = "Unprintable: card declined (str() raised AttributeError)"


class Unprintable(Exception):
    """An application's exception whose ``__str__`` reads an attribute it never set."""

    def __str__(self) -> str:
        return str(self.detail)  # type: ignore[attr-defined]


@dataclass
class RaisesUnprintable(Behaviour):
    """Writes its effect row, then raises :class:`Unprintable` for ``fail_only``, always."""

    def before_return(self, ctx: HandlerContext) -> None:
        self.calls.append((ctx.event_id, ctx.attempt))
        if ctx.event_id == self.fail_only:
            raise Unprintable("card declined")


@pytest.mark.parametrize("mode", ["single", "batched"])
def test_a_handler_exception_whose_str_raises_goes_dead_with_a_dead_letter(
    mode: str,
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    dlq = outboxkit_topic(prefix="dlq")
    doomed, later = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, doomed, "o-doomed", 1)
    produce_event(outboxkit_kafka_bootstrap, topic, later, "o-later", 2)
    behaviour = RaisesUnprintable(fail_only=doomed)
    harness = start(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=2, initial_delay=0.1),
        dead_letter=dlq,
        consumer_options={"batch_max_records": 1 if mode == "single" else 50},
    )
    harness.wait_outcomes(doomed, later)
    kinds = [o.kind for o in harness.outcomes if o.event_id == doomed]
    assert kinds == [OutcomeKind.RETRY, OutcomeKind.DEAD]  # the retry policy, not given up
    row = inbox_row(outboxkit_db_url, "billing", doomed)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("dead", 2)
    assert row["last_error"] == UNPRINTABLE
    assert effects(outboxkit_db_url, doomed) == []
    assert [e[0] for e in effects(outboxkit_db_url)] == [later]
    records = read_topic(outboxkit_kafka_bootstrap, dlq, expect=1)
    assert len(records) == 1
    headers = dict(records[0].headers())
    assert headers["dlq-event-id"] == doomed.encode()
    assert headers["dlq-error"] == UNPRINTABLE.encode()
    rejected = "SELECT reason FROM outboxkit.inbox_rejection WHERE topic = %s"
    assert fetch(outboxkit_db_url, rejected, (topic,)) == []
    assert harness.error is None


async def _cancelled_child() -> None:
    """Await a task that something else cancelled: ``CancelledError`` comes out here, while the
    task awaiting it is not being cancelled."""
    child = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)
    child.cancel()
    await child


def _cancelling_registry(driver: str, calls: list[tuple[str, int]]) -> EventRegistry:
    """A handler that writes its effect row, then on attempt 1 of order ``cancel-me`` raises
    ``CancelledError`` of its own: from ``asyncio.run()`` in the sync handler, from a cancelled
    child task in the async one."""
    registry = EventRegistry()

    def params(event: PaymentRequested, ctx: HandlerContext) -> dict[str, Any]:
        calls.append((ctx.event_id, ctx.attempt))
        return {
            "event_id": ctx.event_id,
            "order_id": event.order_id,
            "amount": event.amount,
            "attempt": ctx.attempt,
        }

    def cancels(event: PaymentRequested, ctx: HandlerContext) -> bool:
        return event.order_id == "cancel-me" and ctx.attempt == 1

    if driver == "confluent":

        @registry.handler(PaymentRequested)
        def handle(event: PaymentRequested, ctx: HandlerContext, session: Session) -> None:
            session.execute(INSERT_EFFECT, params(event, ctx))
            if cancels(event, ctx):
                asyncio.run(_cancelled_child())

    else:

        @registry.handler(PaymentRequested)
        async def handle_async(
            event: PaymentRequested, ctx: HandlerContext, session: AsyncSession
        ) -> None:
            await session.execute(INSERT_EFFECT, params(event, ctx))
            if cancels(event, ctx):
                await _cancelled_child()

    return registry


def test_a_handlers_own_cancelled_error_is_retried_and_the_consumer_runs_on(
    adapter: str,  # noqa: F811
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    cancelled, later = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, cancelled, "cancel-me", 1)
    produce_event(outboxkit_kafka_bootstrap, topic, later, "o-later", 2)
    calls: list[tuple[str, int]] = []
    harness = start(
        [topic],
        registry=_cancelling_registry(adapter, calls),
        policy=RetryPolicy(max_attempts=3, initial_delay=0.1),
    )
    harness.wait_outcomes(cancelled, later)  # raises the consumer's error if it died
    kinds = [o.kind for o in harness.outcomes if o.event_id == cancelled]
    assert kinds == [OutcomeKind.RETRY, OutcomeKind.SUCCEEDED]
    retry = next(o for o in harness.outcomes if o.event_id == cancelled)
    assert (retry.error or "").startswith("HandlerCancelledError: the handler raised")
    row = inbox_row(outboxkit_db_url, "billing", cancelled)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("succeeded", 2)
    assert [e[0] for e in effects(outboxkit_db_url)] == [cancelled, later]  # attempt 1 rolled back
    assert calls == [(cancelled, 1), (cancelled, 2), (later, 1)]
    assert harness.error is None


async def _cancel_the_consumer_during_a_handler(sa_url: str, bootstrap: str, topic: str) -> bool:
    """Whether cancelling the consumer's task while its handler runs ended that task."""
    entered = asyncio.Event()
    registry = EventRegistry()

    @registry.handler(PaymentRequested)
    async def handle(event: PaymentRequested, ctx: HandlerContext, session: AsyncSession) -> None:
        await session.execute(
            INSERT_EFFECT,
            {"event_id": ctx.event_id, "order_id": "o", "amount": 1, "attempt": ctx.attempt},
        )
        entered.set()
        await asyncio.Event().wait()  # until the consumer's task is cancelled

    from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer

    engine = create_async_engine(sa_url)
    try:
        consumer = AiokafkaInboxConsumer(
            AsyncInbox(engine, InboxSettings(consumer="billing", registry=registry)),
            KafkaSettings(bootstrap=bootstrap, client="aiokafka"),
            group_id=f"g-{uuid.uuid4().hex[:8]}",
            topics=[topic],
            dead_letter_check="warn",
        )
        async with consumer:
            task = asyncio.create_task(consumer.run())
            await asyncio.wait_for(entered.wait(), 90)
            task.cancel()
            await asyncio.wait([task], timeout=60)  # a consumer running on never ends
            stopped = task.cancelled()
            if not task.done():
                task.cancel()
                await asyncio.wait([task], timeout=60)
        return stopped
    finally:
        await engine.dispose()


def test_cancelling_the_async_consumers_own_task_during_a_handler_still_stops_it(
    sa_url: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    topic = outboxkit_topic()
    event_id = str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o", 1)
    stopped = asyncio.run(
        _cancel_the_consumer_during_a_handler(sa_url, outboxkit_kafka_bootstrap, topic)
    )
    assert stopped, "the consumer's task ran on after it was cancelled"
    row = inbox_row(outboxkit_db_url, "billing", event_id)
    assert row is not None
    # Stopped, not failed: no failure recorded, the handler's write rolled back, and the row
    # left to the next claim (as after any stop in the middle of a handler).
    assert (row["state"], row["attempts"], row["last_error"]) == ("processing", 1, None)
    assert effects(outboxkit_db_url, event_id) == []
