"""A topic's partitions from aiokafka, telling a missing topic from a broker that is away.

aiokafka raises ``UnknownTopicOrPartitionError`` for a topic its metadata lacks when its wait
for that topic runs out, whether the cluster said the topic does not exist or Kafka did not
answer at all. Only the first is a verdict on the topic: the relay parks such a topic's rows,
and the dead-letter and acknowledgement sender gives such a record up at once. Taken as a
verdict, a broker outage made the relay isolate good rows one by one (parking any sent alone)
and gave acknowledgements up without a retry. So the cluster is asked once more, for all its
topics, as the relay's topic check does: no answer is a retriable ``KafkaTimeoutError``.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, KafkaTimeoutError, UnknownTopicOrPartitionError

from outboxkit.errors import named


async def partitions_for(producer: AIOKafkaProducer, topic: str, seconds: float) -> set[int]:
    """``producer.partitions_for(topic)``; ``UnknownTopicOrPartitionError`` only when the
    cluster's own list of topics lacks it, ``KafkaTimeoutError`` when that list cannot be had
    within ``seconds`` or names the topic after all (it is retried)."""
    try:
        return set(await producer.partitions_for(topic))
    except UnknownTopicOrPartitionError as unknown:
        try:
            cluster = await asyncio.wait_for(producer.client.fetch_all_metadata(), seconds)
        except (KafkaError, TimeoutError, OSError) as exc:
            why = named(exc)
            raise KafkaTimeoutError(
                f"metadata of topic {topic!r} unavailable: Kafka did not answer ({why})"
            ) from unknown
        if topic not in cluster.topics():
            raise
        raise KafkaTimeoutError(f"metadata of topic {topic!r} not there yet") from unknown
