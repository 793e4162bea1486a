"""A topic's partitions from aiokafka, telling a missing topic from a broker that is away.

aiokafka raises ``UnknownTopicOrPartitionError`` for a topic its metadata lacks both when the
cluster's answer did not list it and when no answer came at all within the request timeout
(Kafka away). Only the first is a verdict on the topic: the relay parks such a topic's rows,
and the dead-letter and acknowledgement sender gives such a record up at once. Taken as a
verdict, a broker outage parked good rows (a relay producer that had not sent to the topic yet,
e.g. the second of a shard's producers) and gave acknowledgements up without a retry.
"""

from __future__ import annotations

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaTimeoutError, UnknownTopicOrPartitionError


async def partitions_for(producer: AIOKafkaProducer, topic: str) -> set[int]:
    """``producer.partitions_for(topic)``, but ``KafkaTimeoutError`` (retriable) when no
    metadata answer came while it waited; ``UnknownTopicOrPartitionError`` only when one did."""
    cluster = producer.client.cluster
    if cluster.partitions_for_topic(topic) is not None:  # known: aiokafka answers at once
        return set(await producer.partitions_for(topic))
    answers: list[object] = []
    heard = answers.append
    cluster.add_listener(heard)  # called on each metadata answer, not on a failed request
    try:
        return set(await producer.partitions_for(topic))
    except UnknownTopicOrPartitionError as exc:
        if answers:
            raise
        raise KafkaTimeoutError(
            f"metadata of topic {topic!r} unavailable: Kafka did not answer in time"
        ) from exc
    finally:
        cluster.remove_listener(heard)
