"""The async consumer's close runs to the end even when its task is cancelled meanwhile: a
shutdown that cancels a task already closing must not leave a Kafka client to the garbage
collector (an unclosed producer or connection surfaces later, far from its cause). A close
that cannot end (Kafka away) is cut short after a grace period, so it cannot hold a shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import uuid
import warnings
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from outboxkit.inbox import AsyncInbox, InboxSettings
from outboxkit.inbox import aiokafka as adapter
from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer
from outboxkit.inbox.steps import CloseConsumer, Executor, Step
from outboxkit.settings import KafkaSettings
from tests.integration.inbox_support import REGISTRY, Behaviour, async_handler

pytestmark = pytest.mark.integration

#: Left by a client of ours that nobody closed (aiokafka's and psycopg's own words).
_OUR_LEAKS = ("Unclosed AIOKafka", "was deleted while still open")


class _AtCloseConsumer:
    """The consumer's executor, acting the first time a close reaches ``CloseConsumer``: it cancels
    ``target`` (which lands in the consumer's stop, the step's first await) or, with ``hang``,
    never answers (a Kafka that does not reply)."""

    def __init__(self, inner: Executor, *, hang: bool = False) -> None:
        self.inner, self.hang = inner, hang
        self.target: asyncio.Task[None] | None = None
        self.reached = asyncio.Event()

    def __call__(self, step: Step) -> Any:
        if not isinstance(step, CloseConsumer) or self.reached.is_set():
            return self.inner(step)
        self.reached.set()
        if self.hang:
            return asyncio.Event().wait()
        if self.target is not None:
            self.target.cancel()
        return self.inner(step)

    def release(self, in_flight: Step | None) -> Any:
        return self.inner.release(in_flight)


@contextlib.asynccontextmanager
async def _started(
    sa_url: str, bootstrap: str, topic: str, *, hang: bool = False
) -> AsyncIterator[tuple[AiokafkaInboxConsumer, _AtCloseConsumer]]:
    engine = create_async_engine(sa_url)
    try:
        settings = InboxSettings(consumer=f"c-{uuid.uuid4().hex[:6]}", registry=REGISTRY)
        consumer = AiokafkaInboxConsumer(
            AsyncInbox(engine, async_handler(Behaviour()), settings),
            KafkaSettings(bootstrap=bootstrap, client="aiokafka"),
            group_id=f"g-{uuid.uuid4().hex[:8]}",
            topics=[topic],
            dead_letter_check="warn",  # the sender is started: there are two clients to close
        )
        executor = _AtCloseConsumer(consumer.executor, hang=hang)
        consumer.executor = executor
        await consumer.start()
        await consumer.poll_batch(0.2)
        yield consumer, executor
    finally:
        await engine.dispose()


async def _cancel_a_close(sa_url: str, bootstrap: str, topic: str) -> bool:
    """Whether the cancellation landed inside the close (its task then raised it)."""
    async with _started(sa_url, bootstrap, topic) as (consumer, executor):
        executor.target = asyncio.create_task(consumer.close())
        with pytest.raises(asyncio.CancelledError):
            await executor.target
        return executor.reached.is_set()


def test_a_cancelled_close_still_closes_every_kafka_client(
    sa_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: Callable[..., str]
) -> None:
    topic = outboxkit_topic()
    gc.collect()  # what earlier tests left is theirs, not this test's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cancelled = asyncio.run(_cancel_a_close(sa_url, outboxkit_kafka_bootstrap, topic))
        gc.collect()
    assert cancelled
    leaks = [str(w.message) for w in caught if any(m in str(w.message) for m in _OUR_LEAKS)]
    assert leaks == []


async def test_a_close_that_cannot_end_is_cut_short_after_the_grace(
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(adapter, "CLOSE_GRACE", 0.5)
    topic = outboxkit_topic()
    async with _started(sa_url, outboxkit_kafka_bootstrap, topic, hang=True) as (consumer, ex):
        closing = asyncio.create_task(consumer.close())
        await ex.reached.wait()
        closing.cancel()
        with (
            caplog.at_level(logging.WARNING, logger="outboxkit.inbox.aiokafka"),
            pytest.raises(asyncio.CancelledError),
        ):
            await asyncio.wait_for(closing, 60)  # a TimeoutError would mean it hung on
        assert "consumer close cut short" in caplog.text
        await consumer.close()  # not the cut-short close again: a new one, which ends
