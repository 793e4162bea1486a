"""The async consumer-group member on aiokafka.

The client is created when it subscribes (aiokafka objects belong to the running event loop).
The rebalance listener runs the seam's plain callbacks, commits what a revocation hands back,
and resumes every newly assigned partition.

aiokafka decodes header names as UTF-8 while it parses a fetch: one record with a name that is
not fails ``getmany`` (after it already moved past records of other partitions it then drops),
and does so again after every restart. So the offset after the last record handed out is kept
per partition, and such a fetch is read again from there by :mod:`record_batch`: that record
comes out with a ``header_error`` (the inbox rejects it), the rest as usual, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import (
    CorruptRecordException,
    GroupAuthorizationFailedError,
    InconsistentGroupProtocolError,
    InvalidGroupIdError,
    InvalidSessionTimeoutError,
    KafkaError,
    TopicAuthorizationFailedError,
    UnsupportedSaslMechanismError,
    UnsupportedVersionError,
)

from outboxkit.errors import ConfigurationError, PermanentPublishError, PublishError
from outboxkit.kafka.acl import CONSUMER_ACL_HINT, RefusalNotice, RefusedFetchFilter
from outboxkit.kafka.aiokafka_certificate import CertificateWatch
from outboxkit.kafka.aiokafka_fetch import HeldFetch
from outboxkit.kafka.aiokafka_log_bounds import log_bounds
from outboxkit.kafka.aiokafka_rawfetch import fetch_raw
from outboxkit.kafka.aiokafka_stop import DEFAULT_REQUEST_TIMEOUT_MS, stop_consumer
from outboxkit.kafka.aiokafka_stop import commit as commit_offsets
from outboxkit.kafka.api import AsyncGroupConsumer, ConsumedRecord, Rebalance, Revoke
from outboxkit.kafka.api import TopicPartition as TP
from outboxkit.kafka.config import CONSUMER_OPTIONS_HINT, aiokafka_options
from outboxkit.kafka.group_protocol import ProtocolNotice
from outboxkit.settings import KafkaSettings

logger = logging.getLogger("outboxkit.kafka.consumer")
logging.getLogger("aiokafka.consumer.fetcher").addFilter(RefusedFetchFilter())


def _tps(partitions: Any) -> list[TP]:
    return [(p.topic, p.partition) for p in partitions]


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: AiokafkaGroupConsumer, on_assign: Rebalance, on_revoke: Revoke):
        self.owner = owner
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        # Set by close: a rebalance the closing client finishes (inside its stop) is not the
        # owner's any more (it may already have subscribed a new client).
        self.closed = False

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.owner.generation += 1  # a lenient re-read in flight must not seek any more
        if self.closed:
            return
        offsets = self.on_revoke(_tps(revoked))
        if offsets:
            try:
                await self.owner.commit(dict(offsets))
            except PublishError as exc:
                logger.warning("offset commit on revoke failed (redelivery is recognised): %s", exc)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.owner.generation += 1
        if self.closed:
            return
        self.owner.handed.clear()  # positions start again from the committed offsets
        self.on_assign(_tps(assigned))
        self.owner.resume(_tps(assigned))


def _option_names() -> frozenset[str]:
    """The keyword arguments ``AIOKafkaConsumer`` takes (not its topics or its loop)."""
    names = inspect.signature(AIOKafkaConsumer.__init__).parameters
    return frozenset(names) - {"self", "topics", "loop"}


def _check_options(config: Mapping[str, Any]) -> None:
    """An option aiokafka does not take is refused when the consumer is built, not as a
    ``TypeError`` when it subscribes."""
    known = _option_names()
    unknown = sorted(str(name) for name in config if name not in known)
    if unknown:
        raise ConfigurationError(
            "the Kafka consumer (aiokafka) does not take the option"
            f" {', '.join(map(repr, unknown))}: aiokafka spells options as keyword arguments"
            f" (session_timeout_ms, not session.timeout.ms); {CONSUMER_OPTIONS_HINT}"
        )


# A missing ACL (granted later without a restart), said with what to grant.
_REFUSED = (TopicAuthorizationFailedError, GroupAuthorizationFailedError)
# A join the broker refuses for the consumer's own settings: waiting cannot fix it.
_SETTINGS_REFUSED = (
    InvalidSessionTimeoutError,
    InvalidGroupIdError,
    UnsupportedVersionError,
    UnsupportedSaslMechanismError,
)

_DEFAULT_ASSIGNORS = (RoundRobinPartitionAssignor,)  # AIOKafkaConsumer's default


def _value_refused(when: str, exc: Exception) -> ConfigurationError:
    """An option's value aiokafka refuses (``request_timeout_ms="abc"`` only fails in
    ``start()``): a typed error at start-up, not a traceback on every restart."""
    return ConfigurationError(
        f"the Kafka consumer (aiokafka) cannot be {when}: an option's value is not accepted"
        f" ({type(exc).__name__}; values not shown; {CONSUMER_OPTIONS_HINT})"
    )


class AiokafkaGroupConsumer(AsyncGroupConsumer):
    def __init__(
        self, settings: KafkaSettings, group_id: str, *, config: Mapping[str, Any] | None = None
    ) -> None:
        _check_options(config or {})
        self._settings = settings
        self._options = aiokafka_options(
            settings,
            {"auto_offset_reset": "earliest"},
            options=config,
            group_id=group_id,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        self._consumer: AIOKafkaConsumer | None = None
        self._listener: _Listener | None = None
        # Per partition, the offset after the last record handed out (or sought to).
        self.handed: dict[TP, int] = {}
        self.generation = 0  # bumped by every rebalance callback
        self._refused = False  # the last poll was refused for a missing ACL
        self._notice = RefusalNotice(logger)
        assignors = self._options.get("partition_assignment_strategy", _DEFAULT_ASSIGNORS)
        self._protocol = ProtocolNotice(logger, "aiokafka", group_id, assignors)
        self._fetch = HeldFetch(lambda: self.generation)  # a getmany a poll may leave running

    @property
    def offset_reset(self) -> str:
        return str(self._options.get("auto_offset_reset", "latest"))  # aiokafka's default

    @property
    def _c(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise PublishError("the consumer has not subscribed yet")
        return self._consumer

    async def subscribe(self, topics: list[str], on_assign: Rebalance, on_revoke: Revoke) -> None:
        """Join the group with a new client (after :meth:`close` too: a new member)."""
        self.handed.clear()
        if (stale := self._fetch.take()) is not None:  # another client's: not handed out here
            stale.cancel()
        try:
            consumer = self._consumer = AIOKafkaConsumer(**self._options)
        except (TypeError, ValueError) as exc:  # its message may quote a value
            raise _value_refused("created", exc) from None
        self._listener = _Listener(self, on_assign, on_revoke)
        consumer.subscribe(topics, listener=self._listener)
        with CertificateWatch(self._settings) as watch:
            try:
                await consumer.start()
            except (TypeError, ValueError) as exc:  # a value aiokafka takes, then computes with
                self._consumer, self._listener.closed = None, True
                with contextlib.suppress(Exception):
                    await stop_consumer(consumer)
                raise _value_refused("started", exc) from None
            except KafkaError as exc:
                self._consumer, self._listener.closed = None, True
                await stop_consumer(consumer)
                if isinstance(exc, InconsistentGroupProtocolError):  # tried again, as a start
                    raise self._protocol.error(starting=True) from exc
                refused = isinstance(exc, _REFUSED)
                hint = f" (Kafka refused this consumer: {CONSUMER_ACL_HINT})" if refused else ""
                text = watch.explained(f"Kafka consumer could not start: {exc}{hint}")
                permanent = isinstance(exc, _SETTINGS_REFUSED)
                error = PermanentPublishError if permanent else PublishError
                raise error(text, refused=refused) from exc

    async def poll(self, wait: float, max_records: int) -> list[ConsumedRecord]:
        """At most ``wait`` (and a grace): see :mod:`outboxkit.kafka.aiokafka_fetch`."""
        try:
            batches = await self._fetch.poll(self._c, wait, max_records)
        except (UnicodeDecodeError, CorruptRecordException) as exc:
            # (aiokafka's pure-Python parser raises it as the cause of a CorruptRecordException)
            cause = exc if isinstance(exc, UnicodeDecodeError) else exc.__cause__
            if not isinstance(cause, UnicodeDecodeError):
                raise
            logger.warning("a fetched header name is not UTF-8 (%s): reading it leniently", exc)
            records = await self._read_leniently()
            if not records:
                await asyncio.sleep(wait)  # e.g. the partition's leader is moving: not a spin
            return records
        except InconsistentGroupProtocolError:  # a rejoin refused: aiokafka asks again
            self._protocol.refused()
            await asyncio.sleep(wait)  # nothing is assigned meanwhile: not a spin
            return []
        except _REFUSED as exc:
            # A missing ACL, granted later without a restart: aiokafka fetches again; raised
            # from here it ended the process with a traceback.
            self._notice.refused(str(exc))
            if self._refused:  # twice running with nothing between: not a spin
                await asyncio.sleep(wait)
            self._refused = True  # a refused topic beside a readable one alternates with it
            return []
        self._refused = False
        handed = self.handed
        for tp, found in batches.items():
            if found:
                handed[(tp.topic, tp.partition)] = found[-1].offset + 1
        return [
            ConsumedRecord(
                m.topic, m.partition, m.offset, m.key, m.value, tuple(m.headers or ()), m.timestamp
            )
            for found in batches.values()
            for m in found
        ]

    async def _read_leniently(self) -> list[ConsumedRecord]:
        """Fetch every assigned, unpaused partition again from where its handing out stopped,
        parse it ourselves, and move the consumer past what was read. The failed ``getmany``
        may have moved positions past records it never returned: they are not trusted."""
        # Three phases, so that neither a rebalance during an await nor an error loses a
        # record: every start is known before any position moves; every partition is moved
        # back to its start before any fetch (an error from here on leaves it there, to be
        # read again); positions move forward only after every fetch succeeded, in one go.
        generation = self.generation
        starts: dict[TopicPartition, int] = {}
        for tp in self._c.assignment() - set(self._c.paused()):
            starts[tp] = await self._handed_out(tp)
            if self.generation != generation:
                return []  # rebalanced meanwhile: aiokafka restarts from the committed offsets
        for tp, start in starts.items():
            self._c.seek(tp, start)
        fetched: list[tuple[TopicPartition, list[ConsumedRecord], int | None]] = []
        for tp, start in starts.items():
            fetched.append((tp, *await self._fetch_raw(tp, start)))
            if self.generation != generation:
                return []
        records: list[ConsumedRecord] = []
        for tp, found, next_offset in fetched:
            key = (tp.topic, tp.partition)
            if next_offset is None:  # out of range: aiokafka's reset policy decides
                self.handed.pop(key, None)
                continue
            records += found
            self._c.seek(tp, next_offset)
            self.handed[key] = next_offset
        return records

    async def _handed_out(self, tp: TopicPartition) -> int:
        """Where the handing out of the partition stopped: the offset after the last record
        handed out or sought to; before any, its committed offset, else its first offset
        (``earliest``) or, last resort, its position (``latest``: may be past lost records)."""
        known = self.handed.get((tp.topic, tp.partition))
        if known is not None:
            return known
        committed = await self._c.committed(tp)
        if committed is not None:
            return int(committed)
        if self._options.get("auto_offset_reset") == "earliest":
            return int((await self._c.beginning_offsets([tp]))[tp])
        return int(await self._c.position(tp))

    async def _fetch_raw(
        self, tp: TopicPartition, offset: int
    ) -> tuple[list[ConsumedRecord], int | None]:
        max_bytes = int(self._options.get("max_partition_fetch_bytes", 1024 * 1024))
        return await fetch_raw(self._c, max_bytes, tp, offset)

    def assignment(self) -> set[TP]:
        return set(_tps(self._c.assignment())) if self._consumer is not None else set()

    def _only_assigned(self, partitions: list[TP]) -> list[TopicPartition]:
        current = self.assignment()
        return [TopicPartition(t, p) for t, p in partitions if (t, p) in current]

    def pause(self, partitions: list[TP]) -> None:
        found = self._only_assigned(partitions)
        self._fetch.moved(found, sought=False)
        self._c.pause(*found)

    def resume(self, partitions: list[TP]) -> None:
        self._c.resume(*self._only_assigned(partitions))

    def seek(self, partition: TP, offset: int) -> bool:
        for tp in self._only_assigned([partition]):
            self._fetch.moved([tp], sought=True)
            self._c.seek(tp, offset)
            self.handed[partition] = offset
            return True
        return False

    async def commit(self, offsets: dict[TP, int]) -> None:
        if not offsets:
            return
        timeout = int(self._options.get("request_timeout_ms", DEFAULT_REQUEST_TIMEOUT_MS))
        given = {TopicPartition(t, p): o for (t, p), o in offsets.items()}
        await commit_offsets(self._c, given, timeout)

    async def committed(self, partitions: list[TP], wait: float) -> dict[TP, int]:
        """Bounded by ``wait``: aiokafka retries a retriable error for ever. Every read is
        awaited (or cancelled with the others at the bound): none is left running."""
        tps = [TopicPartition(t, p) for t, p in partitions]
        reads = asyncio.gather(*(self._c.committed(tp) for tp in tps), return_exceptions=True)
        try:
            offsets = await asyncio.wait_for(reads, wait)
        except TimeoutError as exc:
            raise PublishError(f"reading the committed offsets failed: {exc!r}") from exc
        found: dict[TP, int] = {}
        for tp, offset in zip(tps, offsets, strict=True):
            if isinstance(offset, BaseException):
                message = f"reading the committed offsets failed: {offset!r}"
                raise PublishError(message) from offset
            if offset is not None:
                found[(tp.topic, tp.partition)] = int(offset)
        return found

    async def log_bounds(self, partition: TP, wait: float) -> tuple[int, int]:
        return await log_bounds(self._c, partition, wait)

    async def close(self) -> None:
        """Stop the client. Its stop goes on should the close be cancelled (aiokafka's ``stop``
        does nothing a second time: cut short, it would leave the connections open)."""
        consumer, self._consumer, fetch = self._consumer, None, self._fetch.take()
        if self._listener is not None:
            self._listener.closed = True
        if consumer is not None:
            stopping = asyncio.ensure_future(stop_consumer(consumer, fetch))
            stopping.add_done_callback(_stopped)
            await asyncio.shield(stopping)


def _stopped(stopping: asyncio.Future[None]) -> None:
    """Its error, retrieved: ``close`` raises it, unless it was cancelled meanwhile."""
    if not stopping.cancelled() and stopping.exception() is not None:
        logger.info("consumer stop: %s", stopping.exception())
