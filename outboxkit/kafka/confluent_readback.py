"""Reading whole topics back, to their end, as a ``read_committed`` consumer sees them: the
verify tool's view of what the relay published.

No consumer group: the partitions are assigned from offset 0 and read until each reports its
end. librdkafka still wants a ``group.id`` and looks up its coordinator, which a principal with
Read on the topics alone may not describe; that refusal is passed over (the group is not used).
Built like every confluent client (:func:`~outboxkit.kafka.confluent_build.create`), so a
configuration librdkafka refuses is a :class:`ConfigurationError` naming the property.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from outboxkit.errors import PublishError
from outboxkit.kafka.api import ConsumedRecord
from outboxkit.kafka.api import TopicPartition as TP
from outboxkit.kafka.config import confluent_config
from outboxkit.kafka.confluent_build import create
from outboxkit.kafka.confluent_consumer import consumed_record
from outboxkit.settings import KafkaSettings

_READER: dict[str, Any] = {
    "group.id": "outboxkit-verify-reader",  # required by librdkafka; nothing is committed
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",
}


def read_to_end(
    settings: KafkaSettings, partitions: list[TP], timeout: float
) -> list[ConsumedRecord]:
    """Every committed record of ``partitions``, in the order fetched; a
    :class:`PublishError` when the end is not reached within ``timeout`` seconds or the read
    fails for good."""
    consumer = create(
        Consumer,
        confluent_config(settings, None, **_READER),
        "the Kafka read-back consumer (confluent-kafka) cannot be created",
    )
    records: list[ConsumedRecord] = []
    try:
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
            records.append(consumed_record(msg))
    finally:
        consumer.close()
    return records
