"""Batch handlers on the real stack, over both drivers (sync + confluent-kafka, async +
aiokafka): one call with a batch's events, and the one-by-one fallback when that call fails
(a poison event, a cancelled event), with each effect in the database exactly once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outboxkit.inbox import BatchContext, EventRegistry, OutcomeKind, RetryPolicy
from outboxkit.inbox.readback import cancel_event
from tests.integration.inbox_support import (
    INSERT_EFFECT,
    Harness,
    PaymentRequested,
    effects,
    inbox_row,
    inbox_state,
    produce_event,
)
from tests.integration.test_inbox_conformance import adapter, start
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
__all__ = ["adapter", "start"]  # the conformance suite's fixtures: both drivers

TopicFactory = Callable[..., str]


@dataclass
class Bulk:
    """What the test's batch handler does: one effect row per event; then it fails if a
    ``poison`` event is in the call, or waits (cooperatively) while ``slow`` is in it and its
    lease holds. ``calls`` records each call: (event id, partition, offset, attempt) per event."""

    poison: str | None = None
    slow: str | None = None
    calls: list[list[tuple[str, int, int, int]]] = field(default_factory=list)

    def before(self, events: Sequence[PaymentRequested], ctx: BatchContext) -> list[Any]:
        assert len(events) == len(ctx)
        self.calls.append([(c.event_id, c.partition, c.offset, c.attempt) for c in ctx])
        return [
            {"event_id": c.event_id, "order_id": e.order_id, "amount": e.amount, "attempt": 1}
            for e, c in zip(events, ctx, strict=True)
        ]

    def waits(self, ctx: BatchContext) -> bool:
        return self.slow in ctx.event_ids and not ctx.lease_lost

    def after(self, ctx: BatchContext) -> None:
        if self.poison in ctx.event_ids:
            raise RuntimeError("poison in the batch")

    def ids(self) -> list[list[str]]:
        return [[c[0] for c in call] for call in self.calls]


def _registry(adapter: str, bulk: Bulk) -> EventRegistry:
    registry = EventRegistry()
    if adapter == "confluent":

        @registry.batch_handler(PaymentRequested)
        def pay(events: Sequence[PaymentRequested], ctx: BatchContext, session: Session) -> None:
            session.execute(INSERT_EFFECT, bulk.before(events, ctx))
            deadline = time.monotonic() + 60
            while bulk.waits(ctx) and time.monotonic() < deadline:
                time.sleep(0.05)
            bulk.after(ctx)

    else:

        @registry.batch_handler(PaymentRequested)
        async def pay_async(
            events: Sequence[PaymentRequested], ctx: BatchContext, session: AsyncSession
        ) -> None:
            await session.execute(INSERT_EFFECT, bulk.before(events, ctx))
            for _ in range(1200):  # at most ~60 s
                if not bulk.waits(ctx):
                    break
                await asyncio.sleep(0.05)
            bulk.after(ctx)

    return registry


Start = Callable[..., Harness]


def _start(start: Start, adapter: str, topic: str, bulk: Bulk, **settings: Any) -> Harness:
    """The conformance suite's consumer, with a registry whose batch handler is ``bulk``."""
    registry = _registry(adapter, bulk)
    options = {"batch_max_ms": 300.0}
    return start([topic], registry=registry, consumer_options=options, **settings)


def _produce(bootstrap: str, topic: str, partitions: list[list[str]]) -> None:
    for partition, ids in enumerate(partitions):
        for event_id in ids:
            produce_event(bootstrap, topic, event_id, f"o-{event_id[:4]}", 1, partition=partition)


def _ids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def test_one_call_handles_the_batch(
    start: Start,
    adapter: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic(partitions=2)
    p0, p1 = _ids(3), _ids(2)
    _produce(outboxkit_kafka_bootstrap, topic, [p0, p1])
    bulk = Bulk()
    harness = _start(start, adapter, topic, bulk)
    wait_for(lambda: len(harness.outcomes) == 5, what="five outcomes")
    # Every event once, in as many calls as batches: fewer calls than events, each in fetch
    # order per partition, with its own metadata.
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted(p0 + p1)
    assert sorted(e for call in bulk.ids() for e in call) == sorted(p0 + p1)
    assert len(bulk.calls) < 5
    for call in bulk.calls:
        for partition, ids in enumerate([p0, p1]):
            mine = [(c[0], c[2]) for c in call if c[1] == partition]
            assert mine == sorted(mine, key=lambda c: c[1])
            assert all(ids.index(e) == offset for e, offset in mine)
        assert {c[3] for c in call} == {1}
    assert [o.kind for o in harness.outcomes] == [OutcomeKind.SUCCEEDED] * 5
    for event_id in p0 + p1:
        row = inbox_row(outboxkit_db_url, "billing", event_id)
        assert row is not None
        assert row["attempts"] == 1


def test_a_poison_event_in_a_bulk_call_goes_dead_alone(
    start: Start,
    adapter: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Partition 0: a0, poison, b0; partition 1: a1. The bulk call fails and is rolled back;
    then one call per event: a0 and a1 commit (once), b0 waits behind poison, which retries
    alone and goes dead; then b0 runs. Nothing of poison's is written, nothing doubled."""
    topic, dlq = outboxkit_topic(partitions=2), outboxkit_topic(prefix="dlq")
    a0, poison, b0, a1 = _ids(4)
    _produce(outboxkit_kafka_bootstrap, topic, [[a0, poison, b0], [a1]])
    bulk = Bulk(poison=poison)
    policy = RetryPolicy(max_attempts=2, initial_delay=0.1)
    harness = _start(start, adapter, topic, bulk, dead_letter=dlq, policy=policy)
    wait_for(lambda: b0 in {o.event_id for o in harness.outcomes}, what="b0 after poison")
    assert inbox_state(outboxkit_db_url, poison) == "dead"
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted([a0, b0, a1])
    calls = bulk.ids()
    assert [c for c in calls if poison in c and len(c) == 1] == [[poison], [poison]]
    assert calls.index([b0]) > calls.index([poison])  # b0 ran after poison ended
    kinds = [o.kind for o in harness.outcomes if o.event_id == poison]
    assert kinds == [OutcomeKind.RETRY, OutcomeKind.DEAD]
    row = inbox_row(outboxkit_db_url, "billing", poison)
    assert row is not None
    assert row["attempts"] == 2  # the bulk call and its own call were one attempt
    for event_id in (a0, b0, a1):
        row = inbox_row(outboxkit_db_url, "billing", event_id)
        assert row is not None
        assert (row["state"], row["attempts"]) == ("succeeded", 1)


def test_cancel_of_one_event_of_a_bulk_call(
    start: Start,
    adapter: str,
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """a, slow, b in one call: slow is cancelled while the call runs. The call is rolled back,
    a runs again alone and commits, slow is not called again (it stays cancelled), b (held
    behind it) runs afterwards."""
    topic = outboxkit_topic()
    a, slow, b = _ids(3)
    _produce(outboxkit_kafka_bootstrap, topic, [[a, slow, b]])
    bulk = Bulk(slow=slow)
    harness = _start(start, adapter, topic, bulk, lease_seconds=0.6)
    wait_for(lambda: any(slow in c for c in bulk.ids()), what="the bulk call with slow")
    engine = create_engine(sa_url)
    try:
        assert cancel_event(engine, "billing", slow, reason="stop it").cancelled
    finally:
        engine.dispose()
    wait_for(lambda: b in {o.event_id for o in harness.outcomes}, what="b after the cancel")
    assert inbox_state(outboxkit_db_url, a) == "succeeded"
    row = inbox_row(outboxkit_db_url, "billing", slow)
    assert row is not None
    assert (row["state"], row["last_error"]) == ("cancelled", "stop it")
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted([a, b])
    calls = bulk.ids()
    assert sum(slow in c for c in calls) == 1
    assert calls[-2:] == [[a], [b]]
    kinds = {o.event_id: o.kind for o in harness.outcomes}
    assert kinds == {
        a: OutcomeKind.SUCCEEDED,
        slow: OutcomeKind.CANCELLED,
        b: OutcomeKind.SUCCEEDED,
    }
