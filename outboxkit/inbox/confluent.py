"""confluent-kafka adapter: the consumer loop driven synchronously, handlers get a ``Session``.

Everything it decides is in :class:`~outboxkit.inbox.loop.ConsumerLoop`; the client is
:class:`outboxkit.kafka.confluent_consumer.ConfluentGroupConsumer`, built from the shared Kafka
settings (so TLS and SASL reach it and the dead-letter/acks producer alike).
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from outboxkit.inbox.consumer import Clients, InboxConsumer, check_poll_timeout, stopped_by
from outboxkit.inbox.middleware import Inbox
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.steps import drive_sync
from outboxkit.kafka import KafkaClients


class ConfluentInboxConsumer(InboxConsumer[Inbox]):
    """The sync consumer: ``with consumer: consumer.run(stop_event)``."""

    _stop_type, _stop_name = threading.Event, "threading.Event"

    def _clients(self, clients: KafkaClients, group_id: str, config: dict[str, Any]) -> Clients:
        return clients.group_consumer(group_id, config=config), clients.record_sender()

    def start(self) -> None:
        """Check the dead-letter topics, then join the group."""
        try:
            drive_sync(self.loop.start(), self.executor)
        except BaseException:
            self.close()
            raise

    def poll_once(self, timeout: float | None = None) -> Outcome | None:
        """Process one record (polling if none is buffered); ``None`` if nothing was."""
        timeout = check_poll_timeout(timeout)
        return drive_sync(self.loop.poll_once(timeout), self.executor)

    def poll_batch(self, timeout: float | None = None) -> list[Outcome]:
        """Process up to ``batch_max_records`` records in one transaction; their outcomes."""
        timeout = check_poll_timeout(timeout)
        return drive_sync(self.loop.poll_batch(timeout), self.executor)

    def run(self, stop: threading.Event | None = None, max_messages: int | None = None) -> int:
        """Process until ``stop`` (default: the consumer's ``stop``) is set, or ``max_messages``
        deliveries were settled."""
        if stop is None and isinstance(self.stop_event, threading.Event):
            stop = self.stop_event
        self._stop = stop
        try:
            return drive_sync(self.loop.run(stopped_by(stop), max_messages), self.executor)
        finally:
            self._stop = None

    def close(self) -> None:
        """Commit settled offsets, leave the group, flush the producer, stop the lease thread."""
        try:
            drive_sync(self.loop.close(), self.executor)
        finally:
            self.inbox.close()

    def __enter__(self) -> ConfluentInboxConsumer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
