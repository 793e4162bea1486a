"""A stop in the middle of a batch (``KeyboardInterrupt``, ``SystemExit``, the consumer task's
cancellation) rolls the batch's transaction back: only the handler running then is charged its
attempt (a handler that stops the process at every run must still end ``dead``). The other
records' claims are given back, so with ``max_attempts=1`` they run and succeed at the next
start. Before, every record of the batch kept its claim and, at the next start, ended ``dead``
without its handler having run ("attempts exhausted; last error: None")."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outboxkit.errors import BatchTransactionEndedError
from outboxkit.inbox import AsyncInbox, HandlerContext, InboxSettings, RetryPolicy
from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer
from outboxkit.inbox.handler_session import instead_of_failure
from outboxkit.inbox.steps import RunInSavepoint
from outboxkit.settings import KafkaSettings
from tests.integration.inbox_support import (
    EFFECT_DDL,
    INSERT_EFFECT,
    REGISTRY,
    Behaviour,
    Harness,
    PaymentRequested,
    effects,
    inbox_row,
    produce_event,
)
from tests.integration.test_inbox_conformance import adapter, start  # noqa: F401
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
Start = Callable[..., Harness]
ONE_BATCH: dict[str, Any] = {"batch_max_records": 5, "batch_max_ms": 2000.0}  # all five at once
ONCE = RetryPolicy(max_attempts=1)


@dataclass
class StopsAt(Behaviour):
    """The handler of ``stop_at`` raises ``KeyboardInterrupt`` at its first run."""

    stop_at: str = ""

    def before_return(self, ctx: HandlerContext) -> None:
        super().before_return(ctx)
        if ctx.event_id == self.stop_at and ctx.attempt == 1:
            raise KeyboardInterrupt


def _produce(bootstrap: str, topic: str) -> list[str]:
    event_ids = [str(uuid.uuid4()) for _ in range(5)]
    for event_id in event_ids:
        produce_event(bootstrap, topic, event_id, "o", 1)
    return event_ids


def _attempts(db_url: str, event_id: str) -> tuple[str, int]:
    row = inbox_row(db_url, "billing", event_id)
    assert row is not None, event_id
    return row["state"], row["attempts"]


def _only_the_running_one_charged(db_url: str, event_ids: list[str], running: str) -> None:
    for event_id in event_ids:
        expected = ("processing", 1 if event_id == running else 0)
        assert _attempts(db_url, event_id) == expected, event_id
    assert effects(db_url) == []  # the batch's transaction was rolled back


def test_a_stop_mid_batch_charges_only_the_handler_running_then(
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    event_ids = _produce(outboxkit_kafka_bootstrap, topic)
    stopper = event_ids[2]
    behaviour = StopsAt(stop_at=stopper)
    first = start([topic], behaviour, policy=ONCE, consumer_options=ONE_BATCH)
    wait_for(lambda: first.error is not None, what="the stop")
    assert isinstance(first.error, KeyboardInterrupt)
    first.error = None
    first.stop()
    assert behaviour.calls == [(event_id, 1) for event_id in event_ids[:3]]
    _only_the_running_one_charged(outboxkit_db_url, event_ids, stopper)

    start([topic], Behaviour(), policy=ONCE, consumer_options=ONE_BATCH)
    ended = {"succeeded", "dead"}
    wait_for(
        lambda: all(_attempts(outboxkit_db_url, e)[0] in ended for e in event_ids),
        what="every event ended",
    )
    for event_id in event_ids:
        if event_id == stopper:  # its one attempt was the run the stop came in
            assert _attempts(outboxkit_db_url, event_id) == ("dead", 2)
            assert effects(outboxkit_db_url, event_id) == []
        else:
            assert _attempts(outboxkit_db_url, event_id) == ("succeeded", 1), event_id
            assert len(effects(outboxkit_db_url, event_id)) == 1


def test_cancelling_an_async_consumer_mid_batch_gives_the_other_claims_back(
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """The usual stop of an asyncio application: the consumer's task is cancelled while a
    handler of the batch waits."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    topic = outboxkit_topic()
    event_ids = _produce(outboxkit_kafka_bootstrap, topic)
    waiting = event_ids[1]

    async def main() -> list[str]:
        engine = create_async_engine(sa_url)
        reached, calls = asyncio.Event(), list[str]()

        async def handle(event: PaymentRequested, ctx: HandlerContext, session: Any) -> None:
            assert isinstance(session, AsyncSession)
            params = {"order_id": event.order_id, "amount": event.amount, "attempt": 1}
            await session.execute(INSERT_EFFECT, {"event_id": ctx.event_id, **params})
            calls.append(ctx.event_id)
            if ctx.event_id == waiting:
                reached.set()
                await asyncio.Event().wait()  # until the task is cancelled

        settings = InboxSettings(consumer="billing", registry=REGISTRY, policy=ONCE)
        consumer = AiokafkaInboxConsumer(
            AsyncInbox(engine, handle, settings),
            KafkaSettings(bootstrap=outboxkit_kafka_bootstrap),
            group_id=f"g-{uuid.uuid4().hex[:8]}",
            topics=[topic],
            dead_letter=None,
            **ONE_BATCH,
        )

        async def consume() -> None:
            async with consumer:
                while True:
                    await consumer.poll_batch(0.2)

        task = asyncio.create_task(consume())
        try:
            await asyncio.wait_for(reached.wait(), 60)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await engine.dispose()
        return calls

    assert asyncio.run(main()) == event_ids[:2]
    _only_the_running_one_charged(outboxkit_db_url, event_ids, waiting)


@pytest.mark.parametrize("stop", [KeyboardInterrupt, asyncio.CancelledError])
def test_a_stop_in_a_savepoint_the_handler_rolled_back_stays_a_stop(
    sa_url: str, stop: type[BaseException]
) -> None:
    """The handler rolled back (the whole transaction, in SQLAlchemy 2), then the stop came:
    before, it became a ``BatchTransactionEndedError`` (the batch run again one by one) and
    the consumer went on; a handler's own failure still does."""
    engine = create_engine(sa_url)
    try:
        with Session(engine) as session:
            session.begin()
            outer = session.get_transaction()
            session.begin_nested()
            session.execute(text("SELECT 1"))
            session.rollback()
            step = RunInSavepoint(lambda *a: None, (), ())
            assert instead_of_failure(stop(), None, session, outer, step) is None
            ended = instead_of_failure(RuntimeError("boom"), None, session, outer, step)
            assert isinstance(ended, BatchTransactionEndedError)
    finally:
        engine.dispose()
