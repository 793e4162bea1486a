"""The Kafka steps of the consumer loop over the client seam: the same calls for both clients
(the async client's coroutines are awaited by ``drive_async``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from outboxkit.errors import SendStoppedError
from outboxkit.inbox.steps import (
    CloseConsumer,
    CloseSender,
    Commit,
    Committed,
    LogBounds,
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
    SEND_GRACE_SECONDS,
    AsyncGroupConsumer,
    AsyncRecordSender,
    GroupConsumer,
    RecordSender,
)

StopEvent = threading.Event | asyncio.Event


def kafka_steps(
    consumer: GroupConsumer | AsyncGroupConsumer,
    sender: RecordSender | AsyncRecordSender,
    stop: Callable[[], StopEvent | None] = lambda: None,
) -> StepTable:
    """The Kafka steps over the client seam: the same calls for both clients (the async
    client's coroutines are awaited by ``drive_async``). A ``Sleep`` ends early once the event
    ``stop()`` returns is set (a stop must not wait out a back-off): a ``threading.Event`` for
    the sync client, an ``asyncio.Event`` for the async one. So does a ``Publish`` (a dead
    letter, an acknowledgement) still waiting for Kafka after ``SEND_GRACE_SECONDS``."""
    return {
        Subscribe: lambda s: consumer.subscribe(s.topics, s.on_assign, s.on_revoke),
        Poll: lambda s: consumer.poll(s.timeout, s.max_records),
        Commit: lambda s: consumer.commit(dict(s.offsets)),
        Committed: lambda s: consumer.committed(list(s.partitions), s.timeout),
        LogBounds: lambda s: consumer.log_bounds(s.partition, s.timeout),
        Seek: lambda s: consumer.seek(s.partition, s.offset),
        Pause: lambda s: consumer.pause(s.partitions),
        Resume: lambda s: consumer.resume(s.partitions),
        Publish: _publisher(sender, stop),
        TopicExists: _topic_question(sender, stop),
        Sleep: _sleeper(consumer, stop),
        CloseConsumer: lambda s: consumer.close(),
        CloseSender: lambda s: sender.close(),
    }


def _publisher(
    sender: RecordSender | AsyncRecordSender, stop: Callable[[], StopEvent | None]
) -> Callable[[Publish], Any]:
    """Once a send was ended by a stop, the next ones fail at once while the stop lasts: the
    other partitions' acknowledgements and dead letters of the batch wait for no grace each."""
    ended: list[bool] = []

    def stopped(event: StopEvent | None) -> bool:
        if event is None or not event.is_set():
            ended.clear()
            return False
        return bool(ended)

    if isinstance(sender, AsyncRecordSender):

        async def publish_async(step: Publish) -> None:
            event = stop()
            if stopped(event):
                raise SendStoppedError(step.topic)
            try:
                await _send_async(
                    sender.send(step.topic, step.key, step.value, step.headers), step, event
                )
            except SendStoppedError:
                ended.append(True)
                raise

        return publish_async

    def publish(step: Publish) -> None:
        event = stop()
        if stopped(event):
            raise SendStoppedError(step.topic)
        given = event if isinstance(event, threading.Event) else None
        try:
            sender.send(step.topic, step.key, step.value, step.headers, given)
        except SendStoppedError:
            ended.append(True)
            raise

    return publish


async def _send_async(send: Awaitable[None], step: Publish, event: StopEvent | None) -> None:
    """``send``, ended (the sender closes its producer when cancelled) once ``event`` is set
    and the send waited ``SEND_GRACE_SECONDS``: a Kafka that answers, as at a clean shutdown,
    gets its record; one that does not holds a stop that long, not for the sender's timeout."""
    task = asyncio.ensure_future(send)
    try:
        await asyncio.wait([task], timeout=SEND_GRACE_SECONDS)
        if not task.done() and isinstance(event, asyncio.Event):
            stopped = asyncio.ensure_future(event.wait())
            try:
                await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
            if not task.done():
                raise SendStoppedError(step.topic)
        await task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait([task])  # the sender's clean-up; our cancellation propagates
            if not task.cancelled():
                task.exception()  # read: the clean-up's own failure is not ours to raise


def _topic_question(
    sender: RecordSender | AsyncRecordSender, stop: Callable[[], StopEvent | None]
) -> Callable[[TopicExists], Any]:
    """The sync sender's question waits for Kafka in slices that end once the stop is set."""
    if isinstance(sender, AsyncRecordSender):
        return lambda s: sender.topic_exists(s.topic)

    def ask(step: TopicExists) -> bool:
        event = stop()
        return sender.topic_exists(
            step.topic, event if isinstance(event, threading.Event) else None
        )

    return ask


def _sleeper(
    consumer: GroupConsumer | AsyncGroupConsumer, stop: Callable[[], StopEvent | None]
) -> Callable[[Sleep], Any]:
    if isinstance(consumer, AsyncGroupConsumer):
        return lambda s: _sleep_async(s.seconds, stop())

    def sleep(step: Sleep) -> bool:
        event = stop()
        if isinstance(event, threading.Event):
            return event.wait(step.seconds)
        time.sleep(step.seconds)
        return False

    return sleep


async def _sleep_async(seconds: float, event: StopEvent | None) -> bool:
    if not isinstance(event, asyncio.Event):
        await asyncio.sleep(seconds)
        return False
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()
