"""aiokafka adapter: the consumer loop driven on asyncio, handlers are coroutines.

The same :class:`~outboxkit.inbox.loop.ConsumerLoop` as the confluent adapter. Because the async
handler yields to the event loop, a rebalance can revoke the partition *while* it runs: the
loop flags it and the handler's lease counts as lost.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any

from outboxkit.errors import named
from outboxkit.inbox.consumer import Clients, InboxConsumer, check_poll_timeout, stopped_by
from outboxkit.inbox.middleware import AsyncInbox
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.steps import drive_async
from outboxkit.kafka import KafkaClients

logger = logging.getLogger("outboxkit.inbox.aiokafka")

#: Seconds a close may go on after its task was cancelled (the last offset commit, the
#: consumer's and the sender's stop), so no client is left to the garbage collector.
CLOSE_GRACE = 10.0


class AiokafkaInboxConsumer(InboxConsumer[AsyncInbox]):
    """The async consumer: ``async with consumer: await consumer.run(stop_event)``."""

    _stop_type, _stop_name = asyncio.Event, "asyncio.Event"

    _closing: asyncio.Future[None] | None = None

    def _clients(self, clients: KafkaClients, group_id: str, config: dict[str, Any]) -> Clients:
        return clients.async_group_consumer(group_id, config=config), clients.async_record_sender()

    async def start(self) -> None:
        """Check the dead-letter topics, then join the group."""
        try:
            await drive_async(self.loop.start(), self.executor)
        except BaseException:
            await self.close()
            raise

    async def poll_once(self, wait: float | None = None) -> Outcome | None:
        """Process one record (polling if none is buffered); ``None`` if nothing was."""
        wait = check_poll_timeout(wait, "wait")
        return await drive_async(self.loop.poll_once(wait), self.executor)

    async def poll_batch(self, wait: float | None = None) -> list[Outcome]:
        """Process up to ``batch_max_records`` records in one transaction; their outcomes."""
        wait = check_poll_timeout(wait, "wait")
        return await drive_async(self.loop.poll_batch(wait), self.executor)

    async def run(self, stop: asyncio.Event | None = None, max_messages: int | None = None) -> int:
        """Process until ``stop`` (default: the consumer's ``stop``) is set, or ``max_messages``
        deliveries were settled."""
        if stop is None and isinstance(self.stop_event, asyncio.Event):
            stop = self.stop_event
        self._stop = stop
        try:
            return await drive_async(self.loop.run(stopped_by(stop), max_messages), self.executor)
        finally:
            self._stop = None

    async def close(self) -> None:
        """Commit settled offsets, leave the group, stop the clients and the lease task.

        A close cut short leaves the Kafka clients and their connections to the garbage
        collector. So a cancellation while closing (a shutdown cancelling a task already
        closing) lets the close go on for up to :data:`CLOSE_GRACE` seconds before it raises;
        past that, or at a second cancellation, the close is cut short (a Kafka outage must not
        hold a shutdown). A second call waits for the first one's close, or closes again if
        that one was cut short."""
        if self._closing is None or self._closing.cancelled():
            self._closing = asyncio.ensure_future(self._close())
        closing = self._closing
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            if not closing.done():
                try:
                    await asyncio.wait([closing], timeout=CLOSE_GRACE)
                finally:
                    if not closing.done():
                        closing.cancel()
                        logger.warning("consumer close cut short: its clients may be left open")
            finished = closing.done() and not closing.cancelled()
            error = closing.exception() if finished else None
            if error is not None:  # the cancellation is raised; the close's error is logged
                logger.warning("closing the consumer failed: %s", named(error))
            raise

    async def _close(self) -> None:
        try:
            await drive_async(self.loop.close(), self.executor)
        finally:
            await self.inbox.close()

    async def __aenter__(self) -> AiokafkaInboxConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
