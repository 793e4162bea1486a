"""aiokafka's wait for a topic's metadata: a verdict on the topic only when the cluster answered
(``outboxkit.kafka.aiokafka_metadata``). The real broker's side of it, stopped, is in
``tests/fault/test_kafka_away_send.py``; here the cases are scripted."""

from __future__ import annotations

import types
from collections.abc import Callable

import pytest

pytestmark = pytest.mark.unit

aiokafka_errors = pytest.importorskip("aiokafka.errors")


class _Cluster:
    def __init__(self, topics: dict[str, set[int]]) -> None:
        self.topics = topics
        self.listeners: set[Callable[[object], None]] = set()

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.topics.get(topic)

    def add_listener(self, listener: Callable[[object], None]) -> None:
        self.listeners.add(listener)

    def remove_listener(self, listener: Callable[[object], None]) -> None:
        self.listeners.remove(listener)


class _Producer:
    """``partitions_for`` as aiokafka's: the known partitions at once, else metadata requests
    (``answers`` of them answered, each calling the listeners), then the error aiokafka gives."""

    def __init__(self, cluster: _Cluster, answers: int, learns: set[int] | None = None) -> None:
        self.client = types.SimpleNamespace(cluster=cluster)
        self.answers = answers
        self.learns = learns
        self.waited = False

    async def partitions_for(self, topic: str) -> set[int]:
        cluster: _Cluster = self.client.cluster
        if (known := cluster.partitions_for_topic(topic)) is not None:
            return known
        self.waited = True
        for _ in range(self.answers):
            for listener in list(cluster.listeners):
                listener(cluster)
        if self.learns is not None:
            return self.learns
        raise aiokafka_errors.UnknownTopicOrPartitionError()


async def _partitions(producer: _Producer, topic: str) -> set[int]:
    from outboxkit.kafka.aiokafka_metadata import partitions_for

    return await partitions_for(producer, topic)


async def test_a_known_topic_is_answered_without_a_listener() -> None:
    cluster = _Cluster({"t": {0, 1}})
    producer = _Producer(cluster, answers=0)
    assert await _partitions(producer, "t") == {0, 1}
    assert not producer.waited
    assert not cluster.listeners


async def test_a_topic_the_clusters_answer_lacks_stays_unknown() -> None:
    cluster = _Cluster({})
    with pytest.raises(aiokafka_errors.UnknownTopicOrPartitionError):
        await _partitions(_Producer(cluster, answers=2), "gone")
    assert not cluster.listeners  # removed again


async def test_no_answer_at_all_is_a_retriable_timeout_naming_the_topic() -> None:
    cluster = _Cluster({})
    with pytest.raises(aiokafka_errors.KafkaTimeoutError, match=r"'t'.*did not answer") as raised:
        await _partitions(_Producer(cluster, answers=0), "t")
    assert not isinstance(raised.value, aiokafka_errors.UnknownTopicOrPartitionError)
    assert not cluster.listeners


async def test_a_topic_learnt_while_waiting_is_returned() -> None:
    cluster = _Cluster({})
    assert await _partitions(_Producer(cluster, answers=1, learns={0, 1, 2}), "t") == {0, 1, 2}
    assert not cluster.listeners
