"""Dead letters and acknowledgements on confluent-kafka: one record, flushed, acknowledged.

The producer is idempotent, and Kafka gives a producer id only to a principal with Write on
some topic (or IdempotentWrite on the cluster): without Write on the dead-letter and acks
topics it fails with a fatal error, after which librdkafka refuses every record for good. Such
a producer is dropped, so a record after the ACL was granted goes through without a restart.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outboxkit.errors import PermanentPublishError, PublishError
from outboxkit.kafka.api import Headers, RecordSender
from outboxkit.kafka.config import confluent_config
from outboxkit.kafka.confluent_build import create
from outboxkit.kafka.confluent_producer import kafka_error_in
from outboxkit.kafka.errors import ErrorKind, classify
from outboxkit.settings import KafkaSettings

IDEMPOTENT_ACL_HINT = (
    "the idempotent producer of dead letters and acks gets no producer id: grant the consumer's"
    " principal Write and Describe on its dead-letter and acks topics"
)


def _error(topic: str, name: str, text: str) -> PublishError:
    cls = PermanentPublishError if classify(name) is ErrorKind.PERMANENT else PublishError
    return cls(f"publish to {topic!r} failed: {name}: {text}")


class _Dead(PublishError):
    """The producer failed fatally, for a reason found before this record (none to tell)."""


def _is_fatal(error: KafkaError | None) -> bool:
    return error is not None and (error.fatal() or error.code() == KafkaError._FATAL)


def _fatal(topic: str, cause: BaseException | None) -> PublishError:
    """A fatal producer error; a refused producer id is a missing ACL (no retry fixes it)."""
    error = kafka_error_in(cause) if cause is not None else None
    if error is None or error.code() == KafkaError._FATAL:
        return _Dead(f"publish to {topic!r} failed: _FATAL: the producer failed fatally")
    name, text = error.name(), error.str()
    if "AUTHORIZATION_FAILED" in name:
        reason = f"publish to {topic!r} failed: {name}: {text} ({IDEMPOTENT_ACL_HINT})"
        return PermanentPublishError(reason)
    return PublishError(f"publish to {topic!r} failed: {name}: {text}")


class ConfluentRecordSender(RecordSender):
    """An idempotent producer (``acks=all``), created with the first record."""

    def __init__(self, settings: KafkaSettings, *, timeout: float = 30.0) -> None:
        self._settings = settings
        self._timeout = timeout
        self._producer: Producer | None = None

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

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        """One record; a producer found dead is dropped, and the record tried once more with a
        new one if the old one died before this call (its failure then names the cause)."""
        fresh = self._producer is None
        try:
            self._send(topic, key, value, headers)
        except _Dead:
            if fresh:
                raise
            self._send(topic, key, value, headers)

    def _send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        producer = self._get()
        outcome: list[KafkaError | None] = []
        fatal: list[BaseException] = []

        def delivered(err: KafkaError | None, msg: Any) -> None:
            try:
                outcome.append(err)
            except BaseException as exc:  # the fatal error confluent-kafka left pending
                fatal.append(exc)

        try:
            producer.produce(topic, value, key=key, headers=list(headers), on_delivery=delivered)
            producer.flush(self._timeout)
        except BufferError as exc:
            raise PublishError(f"publish to {topic!r} failed: local queue full") from exc
        except (KafkaException, SystemError) as exc:
            error = kafka_error_in(exc)
            if isinstance(exc, SystemError) or _is_fatal(error):
                self._producer = None  # refuses every record from now on
                raise _fatal(topic, fatal[0] if fatal else exc) from exc
            if error is None:
                raise PublishError(f"publish to {topic!r} failed: {exc}") from exc
            raise _error(topic, error.name(), error.str()) from exc
        if fatal or _is_fatal(outcome[0] if outcome else None):
            self._producer = None
            raise _fatal(topic, fatal[0] if fatal else None)
        if not outcome:
            raise PublishError(f"publish to {topic!r} failed: not acknowledged in time")
        if outcome[0] is not None:
            raise _error(topic, outcome[0].name(), outcome[0].str())

    def topic_exists(self, topic: str) -> bool:
        try:
            metadata = self._get().list_topics(topic, timeout=self._timeout)
        except KafkaException as exc:
            raise PublishError(f"metadata of {topic!r} not readable: {exc}") from exc
        found = metadata.topics.get(topic)
        return found is not None and found.error is None

    def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(self._timeout)
