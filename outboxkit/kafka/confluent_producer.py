"""The relay's producer on confluent-kafka (librdkafka); blocking calls run in a worker thread.

A fenced producer is a fatal librdkafka error. confluent-kafka then sets the fatal exception and
still calls the next delivery callback, so the callback's first call fails (``SystemError ...
returned a result with an exception set``) and ``flush`` raises. The delivery callback therefore
catches everything and records the error it finds (``_FENCED``), and ``send`` turns a fenced
record or a failed flush into :class:`ProducerFencedError`: the relay's *lease lost*.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Collection, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outboxkit.errors import ProducerFencedError, PublishError
from outboxkit.kafka.api import (
    NOT_SENT,
    Delivery,
    ProduceRequest,
    RecordError,
    TopicLimits,
    TransactionalProducer,
)
from outboxkit.kafka.config import confluent_config
from outboxkit.kafka.confluent_admin import ConfluentAdmin
from outboxkit.kafka.confluent_build import HandleCalls, create, in_slices
from outboxkit.kafka.errors import TOPIC_WRITE_HINT, ErrorKind, classify, with_acl_hint
from outboxkit.kafka.producer_admin import close_admin_quietly, read_topic_limits
from outboxkit.settings import KafkaSettings

_new = tuple.__new__
_UNASSIGNED = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the partitioner picks
_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes
_BATCH_SIZE = 1_000_000  # librdkafka's default batch.size
_DEFAULT_QUEUE_KBYTES = 1_048_576  # librdkafka's default queue.buffering.max.kbytes
_QUEUE_MARGIN_KBYTES = 2048


def kafka_error_in(exc: BaseException) -> KafkaError | None:
    """The librdkafka error an exception carries (itself or along its causes), if any."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, KafkaException) and seen.args and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        seen = seen.__cause__ or seen.__context__
    return None


def error_of(exc: BaseException) -> RecordError:
    """A client exception as a :class:`RecordError` (client-neutral name and message)."""
    error = kafka_error_in(exc)
    if error is not None:
        return RecordError(error.name(), error.str())
    return RecordError(type(exc).__name__, str(exc))


def raise_for(exc: BaseException, what: str) -> None:
    """Raise the outboxkit error for a failed client call: fenced, or retriable."""
    error = error_of(exc)
    if error.kind is ErrorKind.FENCED:
        raise ProducerFencedError(f"{what}: {error}") from None
    raise PublishError(with_acl_hint(f"{what}: {error}")) from None


def _report(results: list[Delivery | None], index: int, err: Any, msg: Any) -> None:
    """The delivery callback. Nothing may escape it into librdkafka (see the module doc)."""
    try:
        if err is None:  # once per record, in poll/flush: tuple.__new__, no Python frame
            results[index] = _new(Delivery, (msg.partition(), msg.offset(), None))
        else:
            results[index] = Delivery(error=RecordError(err.name(), err.str()))
    except BaseException as exc:  # the fatal error confluent-kafka left pending, usually
        results[index] = Delivery(error=error_of(exc))


def _queue_kbytes(max_queue_bytes: int, config: dict[str, Any]) -> int:
    """``queue.buffering.max.kbytes`` for a queue of about one claim (``max_queue_bytes``).

    librdkafka queues up to 1 GiB by default; this bounds it by one claim. A record that does not
    fit into the whole queue is refused by produce() even when the queue is empty (BufferError),
    so the queue also takes one record of the largest size the producer accepts (a claim always
    carries its first row, however large): ``message.max.bytes`` of the final configuration
    (the user may raise it in properties). The margin covers keys, headers and the checkpoint.
    """
    largest = _bytes_setting(config, "message.max.bytes", _MESSAGE_MAX_BYTES)
    return -(-max(max_queue_bytes, largest) // 1024) + _QUEUE_MARGIN_KBYTES


def _bytes_setting(config: dict[str, Any], name: str, default: int) -> int:
    try:
        return int(config.get(name, default))
    except (TypeError, ValueError):  # librdkafka refuses the value when the producer is created
        return default


def _larger_than_queue(request: ProduceRequest, config: dict[str, Any]) -> RecordError:
    """Why a record that does not fit into the producer's empty queue is refused: it never will."""
    key, value, headers = request.key, request.value, request.headers
    size = len(value) + len(key or b"") + sum(len(n) + len(v or b"") for n, v in headers)
    queue = config.get("queue.buffering.max.kbytes", _DEFAULT_QUEUE_KBYTES)
    return RecordError(
        "MSG_SIZE_TOO_LARGE",
        f"the record ({size} bytes with its key and headers) is larger than the producer's whole"
        f" queue (queue.buffering.max.kbytes = {queue}): it can never be queued",
        local=True,
    )


def _raise_if_fenced(results: Sequence[Delivery | None]) -> None:
    for delivery in results:
        error = delivery.error if delivery is not None else None
        if error is not None and error.kind is ErrorKind.FENCED:
            raise ProducerFencedError(f"delivery failed: {error}")


async def _serve(call: Any, wait: float, results: Sequence[Delivery | None]) -> None:
    """poll/flush (which also serve librdkafka's log lines); a fatal error raises here, after
    the delivery callbacks recorded it."""
    try:
        await asyncio.to_thread(call, wait)
    except (KafkaException, SystemError) as exc:
        _raise_if_fenced(results)
        raise_for(exc, "producer failed")


class ConfluentTransactionalProducer(TransactionalProducer):
    def __init__(
        self,
        settings: KafkaSettings,
        *,
        transactional_id: str | None,
        timeout: float = 30.0,
        max_queue_bytes: int | None = None,
        **overrides: Any,
    ) -> None:
        self.transactional = transactional_id is not None
        self._timeout = timeout
        defaults: dict[str, Any] = {
            # Each batch is flushed at once (flush ignores linger), so linger costs no latency; it
            # lets librdkafka build full requests instead of one tiny request per message.
            "linger.ms": 5,
            # The Java-compatible partitioner, as aiokafka uses: a key maps to the same
            # partition whichever producer implementation the relay runs.
            "partitioner": "murmur2_random",
            "message.timeout.ms": int(timeout * 1000),
            "socket.connection.setup.timeout.ms": 5000,
            "reconnect.backoff.max.ms": 1000,
        }
        required: dict[str, Any] = {"enable.idempotence": True, "acks": "all"}
        if transactional_id is not None:
            defaults["transaction.timeout.ms"] = int(max(timeout * 2, 60) * 1000)
            required["transactional.id"] = transactional_id
        self._config = confluent_config(settings, defaults, **required, **overrides)
        if max_queue_bytes is not None:  # a queue size set in properties wins, as any default
            self._config.setdefault(
                "queue.buffering.max.kbytes", _queue_kbytes(max_queue_bytes, self._config)
            )
        # batch.size bounds a batch of several records; one record alone may reach
        # message.max.bytes (librdkafka counts its framing in both).
        self.largest_batch = _bytes_setting(self._config, "batch.size", _BATCH_SIZE)
        self.largest_record = _bytes_setting(self._config, "message.max.bytes", _MESSAGE_MAX_BYTES)
        self._settings = settings
        self._producer: Producer | None = None
        self._calls = HandleCalls()  # the producer's calls in worker threads (one life, one)
        self._initialised = False  # init_transactions returned (or not transactional)
        self._admin: ConfluentAdmin | None = None  # made at the first read, kept for the life
        self._asked: set[str] = set()  # the topics of the last ask_ahead, and its answers
        self._writable: dict[str, bool] = {}

    @property
    def _p(self) -> Producer:
        if self._producer is None:
            raise PublishError("producer not started or already closed")
        return self._producer

    async def start(self) -> None:
        try:
            self._producer = create(
                Producer, self._config, "the Kafka producer (confluent-kafka) cannot be created"
            )
            if self.transactional:
                # In slices: a stopping relay that gives up on it does not wait for its end.
                await in_slices(self._calls.bind(self._p.init_transactions), self._timeout)
            self._initialised = True
        except (KafkaException, SystemError) as exc:
            raise_for(exc, "init_transactions failed")

    async def topic_problem(self, topic: str) -> RecordError | None:
        try:
            # In slices: a relay that stops meanwhile frees the thread within one.
            list_topics = self._calls.bind(partial(self._p.list_topics, topic))
            metadata = await in_slices(list_topics, min(self._timeout, 10))
        except KafkaException as exc:
            problem = error_of(exc)
            if problem.kind is ErrorKind.PERMANENT:
                return problem
            raise PublishError(f"metadata for topic {topic!r} unavailable: {problem}") from None
        found = metadata.topics.get(topic)
        if found is None:
            return RecordError("UNKNOWN_TOPIC_OR_PART", f"topic {topic!r} does not exist")
        error = found.error
        if error is not None:
            if classify(error.name()) is ErrorKind.PERMANENT:
                return RecordError(error.name(), f"topic {topic!r}: {error.str()}")
            raise PublishError(f"metadata for topic {topic!r}: {error}")
        if self.transactional:
            return await self._write_refused(topic)
        return None

    async def ask_ahead(self, topics: Collection[str]) -> None:
        """A transactional producer asks about Write for all of a claim's new topics at once:
        one wait (the admin's timeout), not one per topic, however many there are."""
        if not self.transactional:
            return
        self._asked, self._writable = set(topics), {}
        with contextlib.suppress(PublishError):  # else all unknown
            self._writable = await self._admin_client().may_write(self._asked)

    async def _write_refused(self, topic: str) -> RecordError | None:
        """Why the topic refuses our records for want of a Write ACL, asked before sending: in a
        transaction librdkafka purges every record alike (``_PURGE_QUEUE``, retriable), so the
        transaction would be retried for ever, its shard stalled. Unknown (no answer, or the
        broker does not say) sends as before: such a transaction then fails as a whole, the shard
        backs off, and its next producer life asks again."""
        if topic in self._asked:
            allowed = self._writable.get(topic)
        else:  # not asked ahead (the checkpoint topic): asked alone
            try:
                allowed = (await self._admin_client().may_write([topic])).get(topic)
            except PublishError:
                allowed = None
        if allowed is not False:
            return None
        return RecordError(
            "TOPIC_AUTHORIZATION_FAILED",
            f"topic {topic!r}: the relay's Kafka principal may not write to it"
            f" ({TOPIC_WRITE_HINT})",
        )

    def _admin_client(self) -> ConfluentAdmin:
        # One admin for all reads of this life: one connection setup, not one per topic.
        if self._admin is None:
            self._admin = ConfluentAdmin(self._settings, timeout=min(self._timeout, 10))
        return self._admin

    async def topic_limits(self, topic: str) -> TopicLimits:
        return await read_topic_limits(self._admin_client(), topic)

    async def begin(self) -> None:
        try:
            self._p.begin_transaction()
        except KafkaException as exc:
            raise_for(exc, "begin_transaction failed")

    async def send(self, requests: Sequence[ProduceRequest]) -> list[Delivery]:
        results: list[Delivery | None] = [None] * len(requests)
        producer = self._p
        produce = producer.produce
        refused: Delivery | None = None
        for index, request in enumerate(requests):
            topic, key, value, given_headers, partition = request
            headers: Any = given_headers if type(given_headers) is list else list(given_headers)
            full_since: float | None = None  # when the queue was first found full for it
            while True:
                try:
                    produce(
                        topic,
                        value,
                        key,
                        _UNASSIGNED if partition is None else partition,
                        on_delivery=partial(_report, results, index),
                        headers=headers,
                    )
                    break
                except BufferError:
                    # The queue is full: deliveries of our earlier records free it. With none of
                    # them pending (their callbacks ran, so librdkafka freed them) the record
                    # alone is larger than the whole queue: waiting would never end.
                    if None not in results[:index]:
                        refused = results[index] = Delivery(
                            error=_larger_than_queue(request, self._config)
                        )
                        break
                    now = time.monotonic()
                    if full_since is None:
                        full_since = now
                    elif now - full_since >= self._timeout:  # the deliveries' own bound
                        raise PublishError(
                            "delivery not acknowledged in time (the producer's queue stayed full)"
                        ) from None
                    await _serve(self._calls.bind(producer.poll), 0.05, results)
                except KafkaException as exc:
                    error = kafka_error_in(exc)
                    if error is not None and error.fatal():
                        raise_for(exc, "produce failed")
                    # produce() only queues: its refusal is librdkafka's own (message.max.bytes)
                    refused = results[index] = Delivery(error=replace(error_of(exc), local=True))
                    break
            if refused is not None:
                # Refused before it was sent: nothing after it goes (the partitioner picks
                # partitions inside produce(), so any later record could share its partition).
                results[index + 1 :] = [NOT_SENT] * (len(requests) - index - 1)
                break
        deadline = time.monotonic() + self._timeout
        while None in results:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishError("delivery not acknowledged in time")
            await _serve(self._calls.bind(producer.flush), min(remaining, 1.0), results)
        _raise_if_fenced(results)
        return [r for r in results if r is not None]

    async def commit(self) -> None:
        try:
            await asyncio.to_thread(self._calls.bind(self._p.commit_transaction), self._timeout)
        except (KafkaException, SystemError) as exc:
            raise_for(exc, "commit_transaction failed")

    async def abort(self) -> None:
        try:
            await asyncio.to_thread(self._calls.bind(self._p.abort_transaction), self._timeout)
        except (KafkaException, SystemError) as exc:
            raise_for(exc, "abort_transaction failed")

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        try:
            if producer is not None:
                # Never reused: pending messages of an abandoned life are purged, not sent later.
                try:
                    producer.purge()
                    await asyncio.to_thread(self._calls.bind(producer.flush), 0)
                except (KafkaException, RuntimeError, SystemError):
                    pass
                if not self._initialised:
                    # Its init goes on in librdkafka; ended now, it cannot fence the producer
                    # that replaces it (HandleCalls). Not a started one: confluent-kafka 2.16's
                    # close() aborts an open transaction without a timeout (measured: still
                    # waiting after 300 s with Kafka away).
                    await self._calls.destroy(producer, self._timeout)
        finally:
            admin, self._admin = self._admin, None
            await close_admin_quietly(admin, self._timeout)
