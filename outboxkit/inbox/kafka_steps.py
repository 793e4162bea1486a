"""The Kafka steps of the consumer loop over the client seam: the same calls for both clients
(the async client's coroutines are awaited by ``drive_async``)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from outboxkit.inbox.steps import (
    CloseConsumer,
    CloseSender,
    Commit,
    Pause,
    Poll,
    Publish,
    Resume,
    Seek,
    Sleep,
    StepTable,
    Subscribe,
    TopicExists,
)
from outboxkit.kafka.api import (
    AsyncGroupConsumer,
    AsyncRecordSender,
    GroupConsumer,
    RecordSender,
)


def kafka_steps(
    consumer: GroupConsumer | AsyncGroupConsumer,
    sender: RecordSender | AsyncRecordSender,
    stop: Callable[[], threading.Event | None] = lambda: None,
) -> StepTable:
    """The Kafka steps over the client seam: the same calls for both clients (the async
    client's coroutines are awaited by ``drive_async``). A sync ``Sleep`` ends early once the
    event ``stop()`` returns is set (a stop must not wait out a back-off); an async one is
    cancelled with its task."""
    return {
        Subscribe: lambda s: consumer.subscribe(s.topics, s.on_assign, s.on_revoke),
        Poll: lambda s: consumer.poll(s.timeout, s.max_records),
        Commit: lambda s: consumer.commit(dict(s.offsets)),
        Seek: lambda s: consumer.seek(s.partition, s.offset),
        Pause: lambda s: consumer.pause(s.partitions),
        Resume: lambda s: consumer.resume(s.partitions),
        Publish: lambda s: sender.send(s.topic, s.key, s.value, s.headers),
        TopicExists: lambda s: sender.topic_exists(s.topic),
        Sleep: _sleeper(consumer, stop),
        CloseConsumer: lambda s: consumer.close(),
        CloseSender: lambda s: sender.close(),
    }


def _sleeper(
    consumer: GroupConsumer | AsyncGroupConsumer, stop: Callable[[], threading.Event | None]
) -> Callable[[Sleep], Any]:
    if isinstance(consumer, AsyncGroupConsumer):
        return lambda s: asyncio.sleep(s.seconds)

    def sleep(step: Sleep) -> None:
        event = stop()
        if event is None:
            time.sleep(step.seconds)
        else:
            event.wait(step.seconds)

    return sleep
