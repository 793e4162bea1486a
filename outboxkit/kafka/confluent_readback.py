"""Reading whole topics back, to their end, as a ``read_committed`` consumer sees them: the
verify tool's view of what the relay published, and ``inbox replay``'s read of a dead-letter
topic (record by record, and its publishes: :class:`ConfluentTopicReadback`).

No consumer group: the partitions are assigned from offset 0 and read until each reports its
end. librdkafka still wants a ``group.id`` and looks up its coordinator, which a principal with
Read on the topics alone may not describe; that refusal is passed over (the group is not used).
Built like every confluent client (:func:`~outboxkit.kafka.confluent_build.create`), so a
configuration librdkafka refuses is a :class:`ConfigurationError` naming the property.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from outboxkit.errors import PermanentPublishError, PublishError
from outboxkit.kafka.api import ConsumedRecord, Headers
from outboxkit.kafka.api import TopicPartition as TP
from outboxkit.kafka.config import confluent_config
from outboxkit.kafka.confluent_build import create
from outboxkit.kafka.confluent_consumer import consumed_record
from outboxkit.kafka.confluent_sender import ConfluentRecordSender
from outboxkit.kafka.readback import TopicReadback
from outboxkit.settings import KafkaSettings

_ABSENT = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
_READER: dict[str, Any] = {
    "group.id": "outboxkit-verify-reader",  # required by librdkafka; nothing is committed
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",
}


def _reader(settings: KafkaSettings) -> Consumer:
    return create(
        Consumer,
        confluent_config(settings, None, **_READER),
        "the Kafka read-back consumer (confluent-kafka) cannot be created",
    )


def read_to_end(
    settings: KafkaSettings, partitions: list[TP], timeout: float
) -> list[ConsumedRecord]:
    """Every committed record of ``partitions``, in the order fetched; a
    :class:`PublishError` when the end is not reached within ``timeout`` seconds or the read
    fails for good."""
    consumer = _reader(settings)
    try:
        return list(_stream(consumer, partitions, timeout, idle=False))
    finally:
        consumer.close()


class ConfluentTopicReadback(TopicReadback):
    """:class:`~outboxkit.kafka.readback.TopicReadback` on confluent-kafka: its end is where
    each partition reports end-of-partition."""

    def __init__(self, settings: KafkaSettings, *, timeout: float = 30.0) -> None:
        self._settings = settings
        self._timeout = timeout
        self._sender = ConfluentRecordSender(settings, timeout=timeout)

    def records(self, topic: str) -> Generator[ConsumedRecord]:
        consumer = _reader(self._settings)
        try:
            try:
                metadata = consumer.list_topics(topic, timeout=self._timeout)
            except KafkaException as exc:
                raise PublishError(f"metadata of {topic!r} not readable: {exc}") from None
            found = metadata.topics.get(topic)
            if found is None or found.error is not None:
                if found is None or found.error.code() in _ABSENT:
                    raise PermanentPublishError(f"topic {topic!r} does not exist")
                raise PublishError(f"metadata of {topic!r} not readable: {found.error}")
            partitions = [(topic, p) for p in sorted(found.partitions)]
            yield from _stream(consumer, partitions, self._timeout, idle=True)
        finally:
            consumer.close()

    def start_sender(self) -> None:
        self._sender.start()

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers) -> None:
        self._sender.send(topic, key, value, headers)

    def close(self) -> None:
        self._sender.close()


def _stream(
    consumer: Consumer, partitions: list[TP], timeout: float, *, idle: bool
) -> Iterator[ConsumedRecord]:
    """Assigned from offset 0, each partition read until it reports its end. ``idle``: the
    timeout is for each wait (restarted after each record handed out), else for the whole."""
    consumer.assign([TopicPartition(t, p, 0) for t, p in partitions])
    pending = set(partitions)
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise PublishError(f"reading the topics back timed out; not at the end: {pending}")
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                pending.discard((msg.topic() or "", msg.partition() or 0))
            elif error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                continue  # the unused group's coordinator (see above)
            elif not error.retriable():
                raise PublishError(f"reading the topics back failed: {error}")
            continue
        yield consumed_record(msg)
        if idle:
            deadline = time.monotonic() + timeout
