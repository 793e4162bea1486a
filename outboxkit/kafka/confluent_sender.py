"""Dead letters and acknowledgements on confluent-kafka: one record, flushed, acknowledged.

The producer is idempotent, and Kafka gives a producer id only to a principal with Write on
some topic (or IdempotentWrite on the cluster): without Write on the dead-letter and acks
topics it fails with a fatal error, after which librdkafka refuses every record for good. Such
a producer is dropped, so a record after the ACL was granted goes through without a restart
(:class:`~outboxkit.kafka.acl.ProducerIdRefusal` spaces the new ones out).
"""

from __future__ import annotations

import contextlib
import threading
import time
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outboxkit.errors import PermanentPublishError, PublishError, SendStoppedError
from outboxkit.kafka.acl import ProducerIdRefusal, publish_failure
from outboxkit.kafka.api import SEND_GRACE_SECONDS, SLICE_SECONDS, Headers, RecordSender
from outboxkit.kafka.config import confluent_config
from outboxkit.kafka.confluent_build import create, sliced
from outboxkit.kafka.confluent_producer import kafka_error_in
from outboxkit.kafka.errors import ErrorKind, classify
from outboxkit.settings import KafkaSettings

_TIMED_OUT = KafkaError._MSG_TIMED_OUT
_ABSENT = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)


def _error(topic: str, name: str, text: str) -> PublishError:
    cls = PermanentPublishError if classify(name) is ErrorKind.PERMANENT else PublishError
    return cls(publish_failure(topic, name, text))


class _DiedBefore(PublishError):
    """The producer had failed fatally before this record was given to it: nothing was sent."""


def _is_fatal(error: KafkaError | None) -> bool:
    return error is not None and (error.fatal() or error.code() == KafkaError._FATAL)


class ConfluentRecordSender(RecordSender):
    """An idempotent producer (``acks=all``), created with the first record."""

    def __init__(self, settings: KafkaSettings, *, timeout: float = 30.0) -> None:
        self._settings = settings
        self._timeout = timeout
        self._producer: Producer | None = None
        self._refusal = ProducerIdRefusal()

    def _get(self) -> Producer:
        if self._producer is None:
            required: dict[str, Any] = {
                "enable.idempotence": True,
                "acks": "all",
                "message.timeout.ms": int(self._timeout * 1000),
            }
            self._producer = create(
                Producer,
                confluent_config(self._settings, None, **required),
                "the Kafka producer for dead letters and acks (confluent-kafka) cannot be created",
            )
        return self._producer

    def start(self) -> None:
        """Build the producer now (a configuration librdkafka refuses fails here)."""
        self._get()

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        stop: threading.Event | None = None,
    ) -> None:
        """One record. A producer found dead when the record is handed to it is dropped and the
        record given once to a new one: only then is it known that nothing of it was sent (a
        record whose own delivery failed fatally may have been written, and is not sent again).
        Its waits go in slices: ``stop`` set, the send ends after the slice it comes in, once it
        has waited ``SEND_GRACE_SECONDS`` (a clean shutdown's records still go)."""
        self._refusal.check(topic)
        try:
            self._send(topic, key, value, headers, stop)
        except _DiedBefore:
            self._send(topic, key, value, headers, stop)

    def _send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        stop: threading.Event | None,
    ) -> None:
        producer = self._get()
        outcome: list[KafkaError | None] = []
        pending: list[BaseException] = []

        def delivered(err: KafkaError | None, msg: Any) -> None:
            try:
                outcome.append(err)
            except BaseException as exc:  # SystemError: confluent-kafka left a fatal error set
                pending.append(exc)

        try:
            producer.produce(topic, value, key=key, headers=list(headers), on_delivery=delivered)
        except BufferError as exc:
            raise PublishError(f"publish to {topic!r} failed: local queue full") from exc
        except (KafkaException, SystemError) as exc:
            fatal = isinstance(exc, SystemError)
            raise self._failed(topic, exc, before=True, fatal=fatal) from exc
        try:
            self._flush(producer, topic, stop, outcome)
        except (KafkaException, SystemError) as exc:
            pending.append(exc)
        if pending:  # a SystemError: confluent-kafka's way of saying the producer died
            first = pending[0]
            raise self._failed(topic, first, fatal=isinstance(first, SystemError)) from first
        timed_out = not outcome or (outcome[0] is not None and outcome[0].code() == _TIMED_OUT)
        if timed_out and self._missing(topic, stop):
            raise _error(topic, "UNKNOWN_TOPIC_OR_PART", f"topic {topic!r} does not exist")
        if not outcome:
            raise PublishError(f"publish to {topic!r} failed: not acknowledged in time")
        if outcome[0] is not None:
            raise self._failed(topic, outcome[0])

    def _flush(
        self, producer: Producer, topic: str, stop: threading.Event | None, outcome: list[Any]
    ) -> None:
        """Wait for the record's delivery report (``outcome``; at most the timeout, in slices).
        Stopped: the producer is dropped with its record purged (neither its close nor the next
        record waits for a delivery Kafka may never answer)."""
        began = time.monotonic()
        while not outcome:
            left = began + self._timeout - time.monotonic()
            if left <= 0 or producer.flush(min(SLICE_SECONDS, left)) == 0 or outcome:
                return
            if (
                stop is not None
                and stop.is_set()
                and time.monotonic() - began >= SEND_GRACE_SECONDS
            ):
                self._producer = None
                with contextlib.suppress(KafkaException, SystemError):
                    producer.purge()
                    producer.flush(0)  # the purge's delivery report
                raise SendStoppedError(topic)

    def _missing(self, topic: str, stop: threading.Event | None = None) -> bool:
        """Whether the cluster says ``topic`` does not exist: librdkafka times a record to a
        missing topic out as it does one while Kafka is away (unless topic creation is on), and
        only the first is given up for good (a missing acks topic: not tried five times)."""
        try:
            ask = partial(self._get().list_topics, topic)
            metadata = sliced(ask, self._timeout, stop if stop is not None else threading.Event())
        except KafkaException:
            if stop is not None and stop.is_set():
                raise SendStoppedError(topic) from None
            return False  # no answer: Kafka away, retried
        found = metadata.topics.get(topic)
        return found is not None and found.error is not None and found.error.code() in _ABSENT

    def _failed(
        self,
        topic: str,
        failure: KafkaError | BaseException,
        *,
        before: bool = False,
        fatal: bool = False,
    ) -> PublishError:
        """The record's error; a fatal one drops the producer (it refuses every record after)."""
        error = failure if isinstance(failure, KafkaError) else kafka_error_in(failure)
        if not (fatal or _is_fatal(error)):
            if error is None:
                return PublishError(f"publish to {topic!r} failed: {failure}")
            return _error(topic, error.name(), error.str())
        self._producer = None
        if error is not None and "AUTHORIZATION_FAILED" in error.name():
            return self._refusal.refused(topic, f"{error.name()}: {error.str()}")
        if before and (error is None or error.code() == KafkaError._FATAL):
            return _DiedBefore(f"publish to {topic!r} failed: the producer had failed fatally")
        cause = f"fatal: {failure}" if error is None else f"{error.name()}: {error.str()}"
        return PublishError(f"publish to {topic!r} failed: {cause}")

    def topic_exists(self, topic: str, stop: threading.Event | None = None) -> bool:
        try:
            ask = partial(self._get().list_topics, topic)
            metadata = sliced(ask, self._timeout, stop if stop is not None else threading.Event())
        except KafkaException as exc:
            raise PublishError(f"metadata of {topic!r} not readable: {exc}") from exc
        found = metadata.topics.get(topic)
        return found is not None and found.error is None

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(self._timeout)
