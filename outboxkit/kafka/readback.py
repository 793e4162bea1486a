"""A topic read once to its end, and records sent, on the caller's thread (``inbox replay``).

One object per run, whichever client is configured: the command decides and acts on each record
as it is read, so nothing but the client's own fetch buffers (its settings bound them) holds
records. The sender is started before anything is changed, so a producer that cannot be built
fails the command before a row is deleted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator
from types import TracebackType

from outboxkit.kafka.api import ConsumedRecord, Headers


class TopicReadback(ABC):
    """``records`` reads every partition of a topic from its start to its end (as a
    ``read_committed`` consumer sees it when the read begins; no consumer group, nothing
    committed) and yields the records as they come. ``timeout`` is how long it waits for the
    next record or end (a stall, not the whole read): past it, a ``PublishError``; no such
    topic, a ``PermanentPublishError``. ``send`` returns once the broker acknowledged the
    record (``PublishError`` otherwise); ``start_sender`` builds its producer up front."""

    @abstractmethod
    def records(self, topic: str) -> Generator[ConsumedRecord]: ...

    @abstractmethod
    def start_sender(self) -> None: ...

    @abstractmethod
    def send(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> TopicReadback:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


__all__ = ["TopicReadback"]
