"""The async consumer's stop event ends a back-off at once, as the sync consumer's does.

After a rejoin whose new client cannot join (Kafka away) the loop sleeps before the next try,
up to 5 s; a stop set meanwhile must not wait that out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from outboxkit.errors import PublishError
from outboxkit.inbox import AsyncInbox, EventRegistry, InboxSettings
from outboxkit.inbox import rejoin as rejoin_module
from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer
from outboxkit.kafka.aiokafka_consumer import AiokafkaGroupConsumer
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit


async def _handler(event: Any, ctx: Any, session: Any) -> None:
    return None


def test_an_async_back_off_ends_once_the_stop_event_is_set(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(rejoin_module, "RESUBSCRIBE_RETRY_SECONDS", 3600.0)

    async def not_watching(seconds: float, *args: Any) -> None:
        raise AssertionError("slept without watching the stop event")

    async def scenario() -> int:
        engine = create_async_engine("postgresql+psycopg://u@127.0.0.1:1/db")  # never connected
        inbox = AsyncInbox(engine, _handler, InboxSettings(consumer="c", registry=EventRegistry()))
        consumer = AiokafkaInboxConsumer(
            inbox,
            KafkaSettings(bootstrap="127.0.0.1:9"),
            group_id="g",
            topics=["t"],
            dead_letter=None,
        )
        tried = asyncio.Event()

        async def cannot_join(self: Any, *args: Any) -> None:
            tried.set()
            raise PublishError("Kafka consumer could not start: no broker")

        monkeypatch.setattr(AiokafkaGroupConsumer, "subscribe", cannot_join)
        # Where a rejoin leaves the loop: the old client closed, the new one to subscribe.
        consumer.loop.subscribed = True
        consumer.loop.rejoin.closed = True
        stop = asyncio.Event()
        # (asyncio's own: kafka_steps would call it for a Sleep that ignores the stop event)
        monkeypatch.setattr(asyncio, "sleep", not_watching)
        try:
            running = asyncio.ensure_future(consumer.run(stop))
            await tried.wait()  # the join failed: the back-off (an hour) begins
            stop.set()
            return await running
        finally:
            monkeypatch.undo()
            await consumer.close()
            await engine.dispose()

    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        assert asyncio.run(scenario()) == 0
    assert any("trying again in 3600 s" in m for m in caplog.messages)
