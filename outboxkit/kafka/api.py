"""The one Kafka seam (internal, not a public API): what outboxkit needs from a Kafka client.

Two implementations of each interface, confluent-kafka and aiokafka, pass one conformance suite.
Nothing outside ``outboxkit.kafka`` imports a Kafka client library. Errors cross this seam as
outboxkit errors: ``PublishError`` (retriable), ``PermanentPublishError``, ``ProducerFencedError``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from outboxkit.errors import PublishError
from outboxkit.kafka.errors import ErrorKind, classify

TopicPartition = tuple[str, int]
Headers = Sequence[tuple[str, bytes | None]]
Stop = threading.Event | None  # a sync caller's stop: set, its waits end after their slice

#: One wait of a blocking Kafka call cut into slices: a stop (or a caller that gave up) ends it
#: after the slice it comes in (see ``confluent_build.in_slices``).
SLICE_SECONDS = 1.0
#: How long a send waits before a stop may end it: a cold producer's start (connection, TLS,
#: login, producer id) fits in it, so the last records of a clean shutdown still go.
SEND_GRACE_SECONDS = 5.0


class ProduceRequest(NamedTuple):
    """One record to produce (a named tuple: one per outbox row, built on the hot path)."""

    topic: str
    key: bytes | None
    value: bytes
    headers: Sequence[tuple[str, bytes]] = ()
    partition: int | None = None


@dataclass(frozen=True)
class RecordError:
    """Why one record was not delivered; ``name`` is the client's error name. ``local``: the
    client refused it before sending (its own size limits), under a broker's name; the topic's
    configuration cannot explain it (not compared: the same error either way)."""

    name: str
    message: str
    local: bool = field(default=False, compare=False)

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


# The error of a record a send did not produce because one before it failed before it was sent
# (see TransactionalProducer.send). Retriable: it goes again, behind the record that failed.
NOT_SENT = Delivery(
    error=RecordError(
        "NotSent", "not produced: a record before it in the same send failed before it was sent"
    )
)


class ConsumedRecord(NamedTuple):
    """One delivered record, client-neutral.

    ``header_error`` says why its headers could not be read (a header name that is not UTF-8,
    which the client libraries refuse to decode); ``headers`` is then empty and the inbox
    rejects the record instead of stalling its partition on it.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int | None
    header_error: str | None = None


def undecodable_name(raw: bytes | bytearray) -> str:
    """The ``header_error`` of a record with a header name that is not UTF-8 (an excerpt)."""
    shown = repr(bytes(raw[:64])) + ("..." if len(raw) > 64 else "")
    return f"a header name is not valid UTF-8: {shown}"


@dataclass(frozen=True)
class TopicLimits:
    """What a topic's configuration makes the broker refuse (``describe configs``): a record
    batch above ``max_message_bytes`` (measured as sent, after compression), and with a
    ``cleanup_policy`` that compacts, a record without a key."""

    max_message_bytes: int | None
    cleanup_policy: str | None

    @property
    def compacted(self) -> bool:
        policy = self.cleanup_policy or ""
        return "compact" in (part.strip() for part in policy.strip("[]").split(","))


LIMIT_NAMES = ("max.message.bytes", "cleanup.policy")

# The names an admin gives (``PublishError.context["error"]``) to a configuration it may not
# read: a missing ACL, which stays until someone grants it.
UNAUTHORISED = frozenset({"TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED"})


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int


def transactional_id(group: str, shard: int) -> str:
    """Stable per (group, shard), so the broker fences a zombie holder of the same shard."""
    return f"outboxkit-relay.{group}.{shard}"


class TransactionalProducer(ABC):
    """The relay's producer. One object lives for one *life*: after a commit timeout, a fatal
    error or a failed batch the relay closes it and makes a new one, never reusing it.

    With a ``transactional.id``, ``start()`` calls ``init_transactions``, which fences any older
    producer with the same id and resolves its open transaction. Raises ``PublishError``
    (retriable) or ``ProducerFencedError``.
    """

    transactional: bool
    # The largest batch of several records this producer builds for one partition (its batch
    # size), and the largest record it sends (alone, in a batch of its own): a topic whose
    # max.message.bytes is at least the one never refuses a batch of several records for its
    # size, at least the other never a record.
    largest_batch: int
    largest_record: int

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def topic_problem(self, topic: str) -> RecordError | None:
        """A permanent reason the topic cannot take records (missing, not authorised), or None."""

    async def ask_ahead(self, topics: Collection[str]) -> None:
        """One claim's new topics, before ``topic_problem`` (each): what more it asks, in one go."""
        return

    @abstractmethod
    async def topic_limits(self, topic: str) -> TopicLimits:
        """What the topic's configuration refuses (one admin request, on an admin client made at
        the first read and kept for the producer's life; ``close()`` closes it);
        ``PublishError`` when it cannot be read (see ``read_topic_limits``)."""

    @abstractmethod
    async def begin(self) -> None: ...

    @abstractmethod
    async def send(self, requests: Sequence[ProduceRequest]) -> list[Delivery]:
        """Produce all, in order, and wait until each is acknowledged or failed.

        A record the client refuses before sending it (larger than its size limit, say) stops
        the send: no record after it that could share its partition is produced (each fails with
        ``NOT_SENT``). Outside a transaction nothing sent can be undone, so a later record of its
        key, sent and acknowledged, would overtake it for good.
        """

    @abstractmethod
    async def commit(self) -> None: ...

    @abstractmethod
    async def abort(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...


class Admin(ABC):
    """Topic metadata and creation (async; the confluent implementation runs in a thread)."""

    @abstractmethod
    async def describe_topic(self, topic: str) -> TopicInfo | None:
        """The topic's partition count, or None if it does not exist."""

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        config: dict[str, str],
        replication_factor: int | None = None,
        *,
        visible_within: float = 30.0,
    ) -> None:
        """Create it (``replication_factor`` None: the broker's ``default.replication.factor``);
        a topic that already exists is not an error. Returns once metadata shows the topic: a
        broker may answer a metadata request from a cache the creation has not reached yet."""
        await self._create_topic(topic, partitions, config, replication_factor)
        deadline = time.monotonic() + visible_within
        while await self.describe_topic(topic) is None:
            if time.monotonic() > deadline:
                raise PublishError(f"topic {topic!r} was created but is not visible yet")
            await asyncio.sleep(0.05)

    @abstractmethod
    async def _create_topic(
        self,
        topic: str,
        partitions: int,
        config: dict[str, str],
        replication_factor: int | None,
    ) -> None: ...

    async def topic_config(self, topic: str, name: str) -> str | None:
        """The effective value of one topic setting (e.g. ``retention.ms``: the topic's own or
        the broker default), or None if the broker has none; ``PermanentPublishError`` if the
        topic does not exist."""
        return (await self.topic_configs(topic, (name,)))[name]

    @abstractmethod
    async def topic_configs(self, topic: str, names: Sequence[str]) -> dict[str, str | None]:
        """The effective values of several topic settings, in one request (each name a key,
        None where the broker has no value); as ``topic_config``. A configuration that may not
        be read raises ``PublishError`` with ``context["error"]`` in ``UNAUTHORISED``."""

    @abstractmethod
    async def close(self) -> None: ...


class CheckpointReader(ABC):
    """Reads a partition to its end, ``read_committed``, for the last value of some keys."""

    @abstractmethod
    async def last_values(
        self, topic: str, partition: int, keys: Collection[bytes]
    ) -> dict[bytes, bytes]:
        """The last committed value of each of ``keys`` found on the partition (one pass)."""

    async def last_committed(self, topic: str, partition: int, key: bytes) -> bytes | None:
        return (await self.last_values(topic, partition, (key,))).get(key)

    @abstractmethod
    async def close(self) -> None: ...


class RecordSender(ABC):
    """An idempotent, non-transactional producer for dead letters and acknowledgements (sync).

    ``send`` returns once the broker acknowledged the record, or raises ``PublishError``
    (``PermanentPublishError`` when retrying cannot help: too large, no topic, not authorised;
    ``SendStoppedError``: ``stop`` set, after ``SEND_GRACE_SECONDS``).
    """

    @abstractmethod
    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        stop: Stop = None,
    ) -> None: ...

    @abstractmethod
    def topic_exists(self, topic: str, stop: Stop = None) -> bool:
        """Whether the cluster knows the topic (start-up check); ``stop`` set: waits end."""

    @abstractmethod
    def close(self) -> None: ...


class AsyncRecordSender(ABC):
    """:class:`RecordSender` for asyncio."""

    @abstractmethod
    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers
    ) -> None: ...

    @abstractmethod
    async def topic_exists(self, topic: str) -> bool: ...

    @abstractmethod
    async def close(self) -> None: ...


Rebalance = Callable[[list[TopicPartition]], None]
# A revocation returns the offsets settled but not committed yet, committed before they go.
Revoke = Callable[[list[TopicPartition]], Mapping[TopicPartition, int]]


class Positions(ABC):
    """What both group consumers do at once, without waiting on the broker. ``pause``,
    ``resume`` and ``seek`` ignore partitions not assigned (any more): their next owner starts
    from the committed offset. ``seek`` says whether the partition's fetch position is now
    ``offset``: a caller that resumes a partition held at a record must not resume it from
    where it was fetching before (past that record).
    """

    @abstractmethod
    def assignment(self) -> set[TopicPartition]: ...

    @abstractmethod
    def pause(self, partitions: list[TopicPartition]) -> None: ...

    @abstractmethod
    def resume(self, partitions: list[TopicPartition]) -> None: ...

    @abstractmethod
    def seek(self, partition: TopicPartition, offset: int) -> bool: ...


class GroupConsumer(Positions):
    """A consumer-group member (sync): ``read_committed``, auto-commit off, manual offsets.

    ``on_assign``/``on_revoke`` run inside ``poll`` (the client's rebalance callbacks; a lost
    assignment is a revocation whose offsets are not committed). After an assignment every
    assigned partition is consuming (not paused), whatever the client kept. ``close`` then
    ``subscribe`` joins the group again with a new client, which starts every assigned partition
    from its committed offset (the inbox replaces a client that keeps refusing a seek this way).
    ``close`` runs neither callback: commit what is settled before it.
    """

    @property
    @abstractmethod
    def offset_reset(self) -> str:
        """Where a partition without a committed offset starts (``auto.offset.reset``, with
        ``earliest`` for its aliases): whether a new member could start past a record."""

    @abstractmethod
    def subscribe(self, topics: list[str], on_assign: Rebalance, on_revoke: Revoke) -> None: ...

    @abstractmethod
    def poll(self, timeout: float, max_records: int) -> list[ConsumedRecord]:
        """Up to ``max_records`` records: waits up to ``timeout`` for the first one only."""

    @abstractmethod
    def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Synchronous commit of the next offsets to read; raises ``PublishError`` on failure."""

    @abstractmethod
    def committed(
        self, partitions: list[TopicPartition], timeout: float
    ) -> dict[TopicPartition, int]:
        """The group's committed offsets of ``partitions``, read from the broker (whichever
        member committed them; a partition with none is left out): a rejoined member learns
        whether another one settled a record it held. ``PublishError`` if they cannot be read
        within ``timeout`` seconds."""

    @abstractmethod
    def log_bounds(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        """Log start and end, asked of the broker (``PublishError`` after ``timeout``)."""

    @abstractmethod
    def close(self) -> None: ...


class AsyncGroupConsumer(Positions):
    """:class:`GroupConsumer` for asyncio; the rebalance callbacks are the same plain functions
    (run by the client's coordinator task, so possibly while a handler awaits)."""

    @property
    @abstractmethod
    def offset_reset(self) -> str:
        """As :attr:`GroupConsumer.offset_reset` (``auto_offset_reset``)."""

    @abstractmethod
    async def subscribe(self, topics: list[str], on_assign: Rebalance, on_revoke: Revoke) -> None:
        """Join the group (starts the client)."""

    @abstractmethod
    async def poll(self, wait: float, max_records: int) -> list[ConsumedRecord]: ...

    @abstractmethod
    async def commit(self, offsets: dict[TopicPartition, int]) -> None: ...

    @abstractmethod
    async def committed(
        self, partitions: list[TopicPartition], wait: float
    ) -> dict[TopicPartition, int]:
        """As :meth:`GroupConsumer.committed` (within ``wait`` seconds)."""

    @abstractmethod
    async def log_bounds(self, partition: TopicPartition, wait: float) -> tuple[int, int]: ...

    @abstractmethod
    async def close(self) -> None: ...
