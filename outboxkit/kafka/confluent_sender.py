"""Dead letters and acknowledgements on confluent-kafka: one record, flushed, acknowledged."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outboxkit.errors import PermanentPublishError, PublishError
from outboxkit.kafka.api import Headers, RecordSender
from outboxkit.kafka.config import confluent_config
from outboxkit.kafka.confluent_build import create
from outboxkit.kafka.errors import ErrorKind, classify
from outboxkit.settings import KafkaSettings


def _error(topic: str, name: str, text: str) -> PublishError:
    cls = PermanentPublishError if classify(name) is ErrorKind.PERMANENT else PublishError
    return cls(f"publish to {topic!r} failed: {name}: {text}")


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
        producer = self._get()
        outcome: list[KafkaError | None] = []

        def delivered(err: KafkaError | None, msg: Any) -> None:
            outcome.append(err)

        try:
            producer.produce(topic, value, key=key, headers=list(headers), on_delivery=delivered)
            producer.flush(self._timeout)
        except BufferError as exc:
            raise PublishError(f"publish to {topic!r} failed: local queue full") from exc
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError):
                raise _error(topic, error.name(), error.str()) from exc
            raise PublishError(f"publish to {topic!r} failed: {exc}") from exc
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
