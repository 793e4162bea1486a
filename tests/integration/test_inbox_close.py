"""The async consumer's close runs to the end even when its task is cancelled meanwhile: a
shutdown that cancels a task already closing must not leave a Kafka client to the garbage
collector (an unclosed producer or connection surfaces later, far from its cause)."""

from __future__ import annotations

import asyncio
import gc
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from outboxkit.inbox import AsyncInbox, InboxSettings
from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer
from outboxkit.inbox.steps import CloseConsumer, Executor, Step
from outboxkit.settings import KafkaSettings
from tests.integration.inbox_support import REGISTRY, Behaviour, async_handler

pytestmark = pytest.mark.integration


class _CancelOnStep:
    """The consumer's executor, cancelling ``target`` as the close plan reaches ``CloseConsumer``
    (so the cancellation lands inside the consumer's stop, the first await of that step)."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.target: asyncio.Task[None] | None = None
        self.cancelled = False

    def __call__(self, step: Step) -> Any:
        if isinstance(step, CloseConsumer) and self.target is not None and not self.cancelled:
            self.cancelled = True
            self.target.cancel()
        return self.inner(step)

    def release(self) -> Any:
        return self.inner.release()


async def _cancel_a_close(sa_url: str, bootstrap: str, topic: str) -> bool:
    """Whether the cancellation landed inside the close (its task then raised it)."""
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
        executor = _CancelOnStep(consumer.executor)
        consumer.executor = executor
        await consumer.start()
        await consumer.poll_batch(0.2)
        executor.target = asyncio.create_task(consumer.close())
        with pytest.raises(asyncio.CancelledError):
            await executor.target
        return executor.cancelled
    finally:
        await engine.dispose()


def test_a_cancelled_close_still_closes_every_kafka_client(
    sa_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: Callable[..., str]
) -> None:
    topic = outboxkit_topic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cancelled = asyncio.run(_cancel_a_close(sa_url, outboxkit_kafka_bootstrap, topic))
        gc.collect()
    assert cancelled
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []
