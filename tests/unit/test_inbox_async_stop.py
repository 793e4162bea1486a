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


def _kafka_away(asked: list[str], stops: list[Any]) -> tuple[Any, Any]:
    """The topic question, sync and async: Kafka does not answer, and the stop event is set
    meanwhile; asked again after that is a failure."""

    def no_kafka(*args: Any) -> bool:
        if asked:
            raise AssertionError("asked Kafka again after the stop was set")
        asked.append("asked")
        stops[0].set()
        raise PublishError("Kafka unreachable")

    async def no_kafka_async(self: Any, topic: str) -> bool:
        return no_kafka()

    return no_kafka, no_kafka_async


@pytest.mark.parametrize("client", ["aiokafka", "confluent"])
def test_a_stop_while_the_start_up_check_waits_for_kafka_ends_run_without_joining(
    monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    """The topic check asks until Kafka answers. Before, a stop set meanwhile was not seen: the
    sync run() went on asking, and once the async sleep ended at a stop it asked in a busy loop
    (thousands of warnings a second), neither returning."""
    asked: list[str] = []
    joined: list[object] = []
    stops: list[Any] = []  # the run's stop event: set once Kafka was asked (and did not answer)
    no_kafka, no_kafka_async = _kafka_away(asked, stops)

    if client == "aiokafka":
        from outboxkit.kafka.aiokafka_sender import AiokafkaRecordSender

        monkeypatch.setattr(AiokafkaRecordSender, "topic_exists", no_kafka_async)
        monkeypatch.setattr(AiokafkaGroupConsumer, "subscribe", lambda *a: joined.append(a))
    else:
        from outboxkit.kafka.confluent_consumer import ConfluentGroupConsumer
        from outboxkit.kafka.confluent_sender import ConfluentRecordSender

        monkeypatch.setattr(
            ConfluentRecordSender, "topic_exists", lambda self, t, stop=None: no_kafka()
        )
        monkeypatch.setattr(ConfluentGroupConsumer, "subscribe", lambda *a: joined.append(a))
    settings = InboxSettings(consumer="c", registry=EventRegistry())
    kafka = KafkaSettings(bootstrap="127.0.0.1:9")

    async def scenario_async() -> int:
        engine = create_async_engine("postgresql+psycopg://u@127.0.0.1:1/db")  # never connected
        inbox = AsyncInbox(engine, _handler, settings)
        consumer = AiokafkaInboxConsumer(inbox, kafka, group_id="g", topics=["t"])
        stop = asyncio.Event()
        stops.append(stop)
        try:
            return await consumer.run(stop)
        finally:
            await consumer.close()
            await engine.dispose()

    if client == "aiokafka":
        assert asyncio.run(scenario_async()) == 0
    else:
        import threading

        import sqlalchemy as sa

        from outboxkit.inbox import Inbox
        from outboxkit.inbox.confluent import ConfluentInboxConsumer

        engine = sa.create_engine("postgresql+psycopg://u@127.0.0.1:1/db")
        sync = ConfluentInboxConsumer(
            Inbox(engine, lambda *a: None, settings), kafka, group_id="g", topics=["t"]
        )
        stop = threading.Event()
        stops.append(stop)
        try:
            assert sync.run(stop) == 0
        finally:
            sync.close()
            engine.dispose()
    assert asked == ["asked"]  # asked once, then the stop ended the wait
    assert joined == []


@pytest.mark.parametrize("client", ["aiokafka", "confluent"])
def test_the_consumers_stop_ends_the_start_up_wait_of_a_with_block(
    monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    """``async with consumer:`` (``with`` for confluent-kafka) starts before any ``run(stop)``:
    its topic check waited for Kafka whatever stop came (``inbox run`` ignored SIGTERM for as
    long as Kafka was away). The event given as ``stop=`` ends that wait too."""
    asked: list[str] = []
    joined: list[object] = []
    stops: list[Any] = []
    no_kafka, no_kafka_async = _kafka_away(asked, stops)

    settings = InboxSettings(consumer="c", registry=EventRegistry())
    kafka = KafkaSettings(bootstrap="127.0.0.1:9")
    if client == "aiokafka":
        from outboxkit.kafka.aiokafka_sender import AiokafkaRecordSender

        monkeypatch.setattr(AiokafkaRecordSender, "topic_exists", no_kafka_async)
        monkeypatch.setattr(AiokafkaGroupConsumer, "subscribe", lambda *a: joined.append(a))

        async def scenario_async() -> int:
            engine = create_async_engine("postgresql+psycopg://u@127.0.0.1:1/db")
            stop = asyncio.Event()
            stops.append(stop)
            inbox = AsyncInbox(engine, _handler, settings)
            consumer = AiokafkaInboxConsumer(inbox, kafka, group_id="g", topics=["t"], stop=stop)
            try:
                async with consumer as running:
                    return await running.run()  # the consumer's stop, already set
            finally:
                await engine.dispose()

        assert asyncio.run(asyncio.wait_for(scenario_async(), 30)) == 0
    else:
        import threading

        import sqlalchemy as sa

        from outboxkit.inbox import Inbox
        from outboxkit.inbox.confluent import ConfluentInboxConsumer
        from outboxkit.kafka.confluent_consumer import ConfluentGroupConsumer
        from outboxkit.kafka.confluent_sender import ConfluentRecordSender

        handed: list[object] = []

        def no_kafka_sync(self: Any, topic: str, stop: Any = None) -> bool:
            handed.append(stop)
            return no_kafka()

        monkeypatch.setattr(ConfluentRecordSender, "topic_exists", no_kafka_sync)
        monkeypatch.setattr(ConfluentGroupConsumer, "subscribe", lambda *a: joined.append(a))
        engine = sa.create_engine("postgresql+psycopg://u@127.0.0.1:1/db")
        stop = threading.Event()
        stops.append(stop)
        sync = ConfluentInboxConsumer(
            Inbox(engine, lambda *a: None, settings), kafka, group_id="g", topics=["t"], stop=stop
        )
        try:
            with sync as running:
                assert running.run() == 0
        finally:
            engine.dispose()
        assert handed == [stop]  # its metadata read waits in slices that end at the stop
    assert asked == ["asked"]
    assert joined == []
