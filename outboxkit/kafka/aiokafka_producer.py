"""The relay's producer on aiokafka: natively asyncio. Same contract as the confluent one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError, UnknownError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from outboxkit.errors import ProducerFencedError, PublishError, detail_of, named
from outboxkit.futures import retrieved
from outboxkit.kafka.aiokafka_admin import AiokafkaAdmin
from outboxkit.kafka.aiokafka_certificate import CertificateWatch
from outboxkit.kafka.aiokafka_metadata import partitions_for
from outboxkit.kafka.aiokafka_stop import stop_or_abandon
from outboxkit.kafka.api import (
    NOT_SENT,
    Delivery,
    ProduceRequest,
    RecordError,
    TopicLimits,
    TransactionalProducer,
)
from outboxkit.kafka.config import aiokafka_options
from outboxkit.kafka.errors import ErrorKind, classify, with_transaction_timeout_hint
from outboxkit.kafka.producer_admin import close_admin_quietly, read_topic_limits
from outboxkit.settings import KafkaSettings


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def raise_for(exc: BaseException, what: str, watch: CertificateWatch | None = None) -> None:
    """Raise the outboxkit error for a failed client call: fenced, or retriable (naming the
    client-certificate settings when ``watch`` saw the broker ask for a certificate)."""
    if classify(_name(exc)) is ErrorKind.FENCED:
        raise ProducerFencedError(f"{what}: {named(exc)}") from exc
    text = with_transaction_timeout_hint(f"{what}: {named(exc)}")
    raise PublishError(watch.explained(text) if watch is not None else text) from exc


def _refused(exc: KafkaError, what: str) -> RecordError:
    """A client error for one record or batch: a fenced producer raises, anything else is that
    record's error."""
    if classify(_name(exc)) is ErrorKind.FENCED:
        raise_for(exc, what)
    return RecordError(_name(exc), detail_of(exc) or "no detail")


def _delivery_error(exc: KafkaError, keyless: bool) -> RecordError:
    """A broker's refusal of a produced batch. aiokafka names the error codes it knows; a newer
    one arrives as a bare ``UnknownError`` with no text, and so does UNKNOWN_SERVER_ERROR, which
    can pass. A compacted topic answers a record without a key with INVALID_RECORD (87), one of
    those newer codes: for a batch holding such a record the refusal is classed permanent (the
    relay then sends the rows one at a time and parks the keyless one that fails again), else it
    stays retriable. Before, that row was retried for ever and its shard stalled behind it."""
    if isinstance(exc, UnknownError) and keyless:
        return RecordError(
            "InvalidRecordError",
            "the broker refused a batch holding a record without a key, with an error code"
            " aiokafka does not name (INVALID_RECORD, as a compacted topic answers a record"
            " without a key, is the likely one)",
        )
    return RecordError(_name(exc), detail_of(exc) or "no detail")


def _unusable(exc: AssertionError, what: str) -> PublishError:
    """aiokafka checks its transaction state machine with ``assert``: after a fatal error (seen
    during a broker restart) ``abort_transaction`` fails with "Invalid state transition
    FATAL_ERROR -> ABORTING_TRANSACTION". That is a producer to replace, not a relay crash."""
    return PublishError(f"{what} failed: producer in an unusable state ({exc})")


class AiokafkaTransactionalProducer(TransactionalProducer):
    def __init__(
        self,
        settings: KafkaSettings,
        *,
        transactional_id: str | None,
        timeout: float = 30.0,
        max_queue_bytes: int | None = None,
        **overrides: Any,
    ) -> None:
        # max_queue_bytes needs no option here: the batches send() builds hold copies of that
        # call's records only (a claim, at most max_batch_bytes) and are all acknowledged before
        # it returns, so the client never holds more than one claim's bytes.
        del max_queue_bytes
        self.transactional = transactional_id is not None
        self._timeout = timeout
        defaults: dict[str, Any] = {
            "linger_ms": 0,
            "request_timeout_ms": int(timeout * 1000),
            "max_batch_size": _BATCH_BYTES,
        }
        if transactional_id is not None:
            defaults["transaction_timeout_ms"] = int(max(timeout * 2, 60) * 1000)
        self._options = aiokafka_options(
            settings,
            defaults,
            enable_idempotence=True,
            acks="all",
            transactional_id=transactional_id,
            **overrides,
        )
        self._producer: AIOKafkaProducer | None = None
        self._max_request_size: int = self._options.get("max_request_size", 1048576)
        # A batch of several records stops at max_batch_size; one record alone may reach
        # max_request_size (see send).
        self.largest_batch = self._options.get("max_batch_size", _BATCH_BYTES)
        self.largest_record = self._max_request_size
        self._settings = settings
        self._admin: AiokafkaAdmin | None = None  # made at the first read, kept for the life
        self._partitioner: Any = self._options.get("partitioner") or DefaultPartitioner()

    @property
    def _p(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise PublishError("producer not started or already closed")
        return self._producer

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(**self._options)
        with CertificateWatch(self._settings) as watch:
            try:
                # For a transactional producer this obtains the producer id and epoch, which
                # fences an older producer with the same transactional.id.
                await asyncio.wait_for(self._producer.start(), self._timeout)
            except (KafkaError, TimeoutError, OSError) as exc:
                await self.close()
                raise_for(exc, "producer start failed", watch)
            except AssertionError as exc:  # "Did we not perform bootstrap?" as a broker stops
                await self.close()
                raise _unusable(exc, "producer start") from exc

    async def topic_problem(self, topic: str) -> RecordError | None:
        try:
            metadata = await asyncio.wait_for(
                self._p.client.fetch_all_metadata(), min(self._timeout, 10)
            )
        except (KafkaError, TimeoutError, OSError) as exc:
            raise PublishError(f"metadata for topic {topic!r} unavailable: {exc}") from exc
        if topic in getattr(metadata, "unauthorized_topics", set()):
            return RecordError("TopicAuthorizationFailedError", f"topic {topic!r} not authorised")
        if topic not in metadata.topics():
            return RecordError("UnknownTopicOrPartitionError", f"topic {topic!r} does not exist")
        return None

    async def topic_limits(self, topic: str) -> TopicLimits:
        # One admin for all reads of this life: one bootstrap, not one per topic.
        if self._admin is None:
            self._admin = AiokafkaAdmin(self._settings, timeout=min(self._timeout, 10))
        return await read_topic_limits(self._admin, topic)

    async def begin(self) -> None:
        try:
            await asyncio.wait_for(self._p.begin_transaction(), self._timeout)
        except (KafkaError, TimeoutError) as exc:
            raise_for(exc, "begin_transaction failed")
        except AssertionError as exc:
            raise _unusable(exc, "begin_transaction") from exc

    async def send(self, requests: Sequence[ProduceRequest]) -> list[Delivery]:
        """Each partition's records go into batches this producer builds itself (up to
        ``_BATCH_BYTES``, in order): one future per batch instead of a ``send()`` call, a
        partitioner call and a future per record, about a quarter of the client's CPU per record.
        A batch's outcome is each of its records' (the broker accepts or refuses batches)."""
        producer = self._p
        results: list[Delivery | None] = [None] * len(requests)
        groups = await self._partitioned(producer, requests, results)
        sent: list[tuple[asyncio.Future[Any] | RecordError, list[int]]] = []
        for (topic, partition), indexes in groups.items():
            builder, batch = producer.create_batch(), list[int]()
            for position, index in enumerate(indexes):
                request = requests[index]
                if _append(builder, request):
                    batch.append(index)
                    continue
                # Full: send it, start the next one. A batch refused before it was sent, or a
                # record not even an empty batch takes, ends its partition's share of this send.
                outcome = await _submit(producer, builder, topic, partition)
                sent.append((outcome, batch))
                builder, batch = producer.create_batch(), [index]
                if isinstance(outcome, RecordError) or not _append(builder, request):
                    if not isinstance(outcome, RecordError):
                        results[index] = Delivery(error=_UNBATCHABLE)
                    _not_sent(results, indexes[position:])
                    batch = []
                    break
            if batch:
                sent.append((await _submit(producer, builder, topic, partition), batch))
        fenced: BaseException | None = None
        try:
            async with asyncio.timeout(self._timeout):
                for outcome, batch in sent:  # every future is awaited: none left unretrieved
                    if not isinstance(outcome, RecordError):
                        try:
                            meta = await outcome
                        except KafkaError as exc:
                            if classify(_name(exc)) is ErrorKind.FENCED:
                                fenced = fenced or exc
                            keyless = any(requests[i].key is None for i in batch)
                            outcome = _delivery_error(exc, keyless)
                        else:
                            for n, index in enumerate(batch):
                                results[index] = _new(
                                    Delivery, (meta.partition, meta.offset + n, None)
                                )
                            continue
                    refused = Delivery(error=outcome)
                    for index in batch:
                        results[index] = refused
        except TimeoutError as exc:
            for outcome, _ in sent:  # not awaited: failed later, they would be logged as ERRORs
                if isinstance(outcome, asyncio.Future):
                    outcome.add_done_callback(retrieved)
            raise PublishError("delivery not acknowledged in time") from exc
        if fenced is not None:
            raise_for(fenced, "delivery failed")
        denied = _write_refused(producer) if any(d and d.error for d in results) else None
        if denied:
            results = [
                _explained(d, request.topic, denied)
                for d, request in zip(results, requests, strict=True)
            ]
        return [d if d is not None else Delivery(error=_UNBATCHABLE) for d in results]

    async def _partitioned(
        self,
        producer: AIOKafkaProducer,
        requests: Sequence[ProduceRequest],
        results: list[Delivery | None],
    ) -> dict[tuple[str, int], list[int]]:
        """Request indexes by topic and partition, in order, partitioned as aiokafka's own
        ``send()`` does (same partitioner, same partition lists). A record that cannot go (an
        unknown topic, larger than ``max_request_size``) gets its error in ``results``, and the
        records after it ``NOT_SENT``: only those before it are returned."""
        groups: dict[tuple[str, int], list[int]] = {}
        topics: dict[str, tuple[list[int], list[int], dict[bytes | None, int]] | RecordError] = {}
        for index, request in enumerate(requests):
            topic, key, value, headers, partition = request
            size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, _list(headers))
            if size <= self._max_request_size:
                known = topics.get(topic)
                if known is None:
                    known = topics[topic] = await _topic_partitions(producer, topic, self._timeout)
                if not isinstance(known, RecordError):
                    if partition is None:
                        every, available, by_key = known
                        partition = by_key.get(key) if key is not None else None
                        if partition is None:
                            partition = self._partitioner(key, every, available)
                            if key is not None:
                                by_key[key] = partition
                    groups.setdefault((topic, partition), []).append(index)
                    continue
                problem = known
            else:
                problem = RecordError(
                    "MessageSizeTooLargeError",
                    f"the record is {size} bytes, above max_request_size"
                    f" ({self._max_request_size})",
                    local=True,
                )
            # Nothing is sent yet: every record after it stays back too (see ``send``).
            results[index] = Delivery(error=problem)
            _not_sent(results, range(index + 1, len(requests)))
            break
        return groups

    async def commit(self) -> None:
        try:
            await asyncio.wait_for(self._p.commit_transaction(), self._timeout)
        except (KafkaError, TimeoutError) as exc:
            raise_for(exc, "commit_transaction failed")
        except AssertionError as exc:
            raise _unusable(exc, "commit_transaction") from exc

    async def abort(self) -> None:
        try:
            await asyncio.wait_for(self._p.abort_transaction(), self._timeout)
        except (KafkaError, TimeoutError) as exc:
            raise_for(exc, "abort_transaction failed")
        except AssertionError as exc:
            raise _unusable(exc, "abort_transaction") from exc

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        try:
            if producer is not None:
                with contextlib.suppress(KafkaError, TimeoutError, OSError):
                    await stop_or_abandon(producer, self._timeout)
        finally:
            admin, self._admin = self._admin, None
            await close_admin_quietly(admin, self._timeout)


# Delivery is a NamedTuple: tuple.__new__ skips its keyword-handling __new__ (once per record).
_new = tuple.__new__
_BATCH_BYTES = 256 * 1024  # a batch the producer builds itself (aiokafka's default is 16 KiB)
_UNBATCHABLE = RecordError("KafkaError", "the record could not be added to a batch", local=True)


async def _topic_partitions(
    producer: AIOKafkaProducer, topic: str, seconds: float
) -> tuple[list[int], list[int], dict[bytes | None, int]] | RecordError:
    """A topic's partitions as aiokafka's ``send()`` lists them, and an empty key cache."""
    try:
        every = list(await partitions_for(producer, topic, seconds))  # Kafka away: retriable
    except KafkaError as exc:
        return _refused(exc, "send failed")
    available = list(producer.client.cluster.available_partitions_for_topic(topic))
    return every, available, {}


def _write_refused(producer: AIOKafkaProducer) -> set[str]:
    """The topics the broker refused to add to the transaction (no Write ACL). aiokafka then
    fails every batch with a bare InvalidTxnState, and keeps the refusal, which names the
    topics, in its transaction waiter, which nothing awaits (logged as never retrieved)."""
    waiter = getattr(getattr(producer, "_txn_manager", None), "_transaction_waiter", None)
    if not isinstance(waiter, asyncio.Future) or not waiter.done() or waiter.cancelled():
        return set()
    exc = waiter.exception()  # retrieved: said here, not as an unretrieved future
    if not isinstance(exc, TopicAuthorizationFailedError) or not exc.args:
        return set()
    return {str(topic) for topic in exc.args[0]} if isinstance(exc.args[0], set) else set()


def _explained(delivery: Delivery | None, topic: str, refused: set[str]) -> Delivery | None:
    """A record of a refused topic fails for good; the others of the failed transaction go
    again, saying which topic without a Write ACL failed it."""
    if delivery is None or delivery.error is None or delivery.error.local:
        return delivery  # refused by the client itself, before sending: its own reason
    named = ", ".join(repr(t) for t in sorted(refused))
    if topic in refused:
        why = f"topic {topic!r}: the relay's Kafka principal may not write to it (grant it Write"
        return Delivery(error=RecordError("TopicAuthorizationFailedError", why + " on the topic)"))
    why = f"the transaction failed: the relay's Kafka principal may not write to {named} (grant"
    return Delivery(error=RecordError(delivery.error.name, why + " it Write on that topic)"))


def _not_sent(results: list[Delivery | None], indexes: Iterable[int]) -> None:
    """Records left out of a send behind one that failed before it was sent."""
    for index in indexes:
        if results[index] is None:
            results[index] = NOT_SENT


def _list(headers: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """aiokafka's record builder takes headers as a list only (the relay builds lists)."""
    return headers if type(headers) is list else list(headers)


def _append(builder: Any, request: ProduceRequest) -> bool:
    return (
        builder.append(
            timestamp=None, key=request.key, value=request.value, headers=_list(request.headers)
        )
        is not None
    )


async def _submit(
    producer: AIOKafkaProducer, builder: Any, topic: str, partition: int
) -> asyncio.Future[Any] | RecordError:
    """Queue a built batch (waits while the partition's previous batch is not yet sent)."""
    try:
        future: asyncio.Future[Any] = await producer.send_batch(builder, topic, partition=partition)
    except KafkaError as exc:
        return _refused(exc, "send failed")
    except AssertionError as exc:  # "Unrecognized partition": metadata older than the partition
        raise PublishError(f"send to {topic} [{partition}] failed: {exc}") from exc
    return future
