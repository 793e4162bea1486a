"""The one producer seam of the relay (internal, not a public API).

Two implementations pass the same conformance suite: confluent-kafka (default) and aiokafka.
A producer object lives for one *life*: after a commit timeout, a fatal error or a failed batch
the relay closes it and makes a new one, never reusing it. Transactional producers have a stable
``transactional.id`` per (relay group, shard); ``start()`` calls ``init_transactions``, which
fences any older producer with the same id and resolves its open transaction.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from outboxkit.relay.producer.errors import ErrorKind, classify


class ProduceRequest(NamedTuple):
    """One record to produce (a named tuple: one per outbox row, built on the hot path)."""

    topic: str
    key: bytes | None
    value: bytes
    headers: Sequence[tuple[str, bytes]] = ()
    partition: int | None = None


@dataclass(frozen=True)
class RecordError:
    """Why one record was not delivered; ``name`` is the client's error name."""

    name: str
    message: str

    @property
    def kind(self) -> ErrorKind:
        return classify(self.name)

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"


class Delivery(NamedTuple):
    """One record's outcome (a named tuple: one per record, built in delivery callbacks)."""

    partition: int | None = None
    offset: int | None = None
    error: RecordError | None = None


def transactional_id(group: str, shard: int) -> str:
    """Stable per (group, shard), so the broker fences a zombie holder of the same shard."""
    return f"outboxkit-relay.{group}.{shard}"


class RelayProducer(ABC):
    """Publish batches; raise ``PublishError`` (retriable) or ``ProducerFencedError``."""

    transactional: bool

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def topic_problem(self, topic: str) -> RecordError | None:
        """A permanent reason the topic cannot take records (missing, not authorised), or None."""

    @abstractmethod
    async def begin(self) -> None: ...

    @abstractmethod
    async def send(self, requests: Sequence[ProduceRequest]) -> list[Delivery]:
        """Produce all, in order, and wait until each is acknowledged or failed."""

    @abstractmethod
    async def commit(self) -> None: ...

    @abstractmethod
    async def abort(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...
