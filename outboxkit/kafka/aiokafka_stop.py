"""Stopping an aiokafka consumer while Kafka is away: its ``stop()``, finished, and a bounded
offset commit.

``AIOKafkaConsumer.stop()`` closes its fetcher, which cancels each pending fetch task and
awaits it. A fetch that failed while Kafka is away waits out its retry back-off outside the
``except CancelledError`` that ends a cancelled one quietly, so awaiting it re-raises the
cancellation: ``stop()`` raised ``CancelledError`` without our task being cancelled, and never
closed its client (its connections stayed open). ``outboxkit inbox run`` stopped by SIGTERM
during an outage exited with status 1, a traceback and an unclosed producer.

aiokafka's ``commit()`` waits for a group coordinator for as long as there is none: during an
outage a commit (the one a close makes too) held the consumer, and a stop, until Kafka came
back. librdkafka fails such a commit at once (``_WAIT_COORD``); so does :func:`commit`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from outboxkit.errors import PublishError, named

logger = logging.getLogger("outboxkit.kafka.consumer")

#: aiokafka's own default for ``request_timeout_ms``: a commit's bound unless one is set.
DEFAULT_REQUEST_TIMEOUT_MS = 40_000
#: How often a waiting commit looks whether aiokafka still knows a coordinator.
COORDINATOR_CHECK_SECONDS = 0.1


async def stop_consumer(consumer: AIOKafkaConsumer) -> None:
    """``consumer.stop()``; should it raise a cancellation that is not this task's, the rest
    of the stop (the fetches still pending, the client) is done here."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # our own cancellation
        logger.info("consumer stop: a fetch cancelled in its retry back-off; closing the client")
        fetcher: Any = getattr(consumer, "_fetcher", None)
        pending = [t for t in getattr(fetcher, "_pending_tasks", ()) if not t.done()]
        for fetch in pending:
            fetch.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        client: Any = getattr(consumer, "_client", None)
        if client is not None:
            await client.close()


def _coordinator_unknown(consumer: AIOKafkaConsumer) -> bool:
    coordinator: Any = getattr(consumer, "_coordinator", None)
    return coordinator is not None and getattr(coordinator, "coordinator_id", 0) is None


async def commit(
    consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int], request_timeout_ms: int
) -> None:
    """``offsets`` committed; a :class:`PublishError` once no group coordinator is known (Kafka
    away: aiokafka forgets the coordinator at the first failed request; the offsets stay
    pending, a redelivery is recognised), or after the request timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request_timeout_ms / 1000
    task = asyncio.ensure_future(consumer.commit(offsets))
    try:
        while not task.done():
            if _coordinator_unknown(consumer):
                raise PublishError("offset commit failed: no group coordinator (Kafka away?)")
            left = deadline - loop.time()
            if left <= 0:
                raise PublishError(
                    f"offset commit failed: not answered within {request_timeout_ms / 1000:g} s"
                )
            await asyncio.wait([task], timeout=min(left, COORDINATOR_CHECK_SECONDS))
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait([task])  # its clean-up; our own cancellation still propagates
    try:
        task.result()
    except KafkaError as exc:
        raise PublishError(f"offset commit failed: {named(exc)}") from exc
