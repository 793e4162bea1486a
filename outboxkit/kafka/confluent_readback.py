"""Reading whole topics back, to their end, as a ``read_committed`` consumer sees them: the
verify tool's view of what the relay published, and ``inbox replay``'s read of a dead-letter
topic.

No consumer group: the partitions are assigned from offset 0 and read until each reports its
end. librdkafka still wants a ``group.id`` and looks up its coordinator, which a principal with
Read on the topics alone may not describe; that refusal is passed over (the group is not used).
Built like every confluent client (:func:`~outboxkit.kafka.confluent_build.create`), so a
configuration librdkafka refuses is a :class:`ConfigurationError` naming the property.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from outboxkit.errors import PermanentPublishError, PublishError
from outboxkit.kafka.api import ConsumedRecord
from outboxkit.kafka.api import TopicPartition as TP
from outboxkit.kafka.config import confluent_config
from outboxkit.kafka.confluent_build import create
from outboxkit.kafka.confluent_consumer import consumed_record
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
        return _read(consumer, partitions, timeout, None)
    finally:
        consumer.close()


def read_topic(
    settings: KafkaSettings,
    topic: str,
    timeout: float,
    keep: Callable[[ConsumedRecord], bool] | None = None,
) -> list[ConsumedRecord]:
    """Every committed record of every partition of ``topic`` that ``keep`` keeps (all without
    one), in the order fetched; a :class:`PermanentPublishError` when the topic does not exist,
    a :class:`PublishError` as :func:`read_to_end`."""
    consumer = _reader(settings)
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise PublishError(f"metadata of {topic!r} not readable: {exc}") from None
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            absent = found is None or found.error.code() in _ABSENT
            if absent:
                raise PermanentPublishError(f"topic {topic!r} does not exist")
            raise PublishError(f"metadata of {topic!r} not readable: {found.error}")
        partitions = [(topic, p) for p in sorted(found.partitions)]
        return _read(consumer, partitions, timeout, keep)
    finally:
        consumer.close()


def _read(
    consumer: Consumer,
    partitions: list[TP],
    timeout: float,
    keep: Callable[[ConsumedRecord], bool] | None,
) -> list[ConsumedRecord]:
    """Assigned from offset 0, each partition read until it reports its end."""
    records: list[ConsumedRecord] = []
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
        record = consumed_record(msg)
        if keep is None or keep(record):
            records.append(record)
    return records
