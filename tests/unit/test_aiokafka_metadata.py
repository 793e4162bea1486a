"""aiokafka's wait for a topic's metadata: a verdict on the topic only when the cluster's own
list of topics lacks it (``outboxkit.kafka.aiokafka_metadata``). The real broker's side of it,
stopped, is in ``tests/fault/test_kafka_away_send.py``; here the cases are scripted."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable

import pytest

pytestmark = pytest.mark.unit

aiokafka_errors = pytest.importorskip("aiokafka.errors")


class _Producer:
    """``partitions_for`` as aiokafka's: ``known`` at once, else its UnknownTopicOrPartitionError;
    ``client.fetch_all_metadata`` runs ``answer``."""

    def __init__(self, known: set[int] | None, answer: Callable[[], Awaitable[object]]) -> None:
        self.known = known
        self.asked = 0

        async def fetch_all_metadata() -> object:
            self.asked += 1
            return await answer()

        self.client = types.SimpleNamespace(fetch_all_metadata=fetch_all_metadata)

    async def partitions_for(self, topic: str) -> set[int]:
        if self.known is None:
            raise aiokafka_errors.UnknownTopicOrPartitionError()
        return self.known


def _listing(*topics: str) -> Callable[[], Awaitable[object]]:
    async def answer() -> object:
        return types.SimpleNamespace(topics=lambda: set(topics))

    return answer


async def _refused() -> object:
    raise aiokafka_errors.KafkaConnectionError("Unable to bootstrap")


async def _silent() -> object:
    await asyncio.Event().wait()
    raise AssertionError("never answered")


async def _partitions(producer: _Producer, topic: str = "t") -> set[int]:
    from outboxkit.kafka.aiokafka_metadata import partitions_for

    return await partitions_for(producer, topic, 0.05)


async def test_a_known_topic_is_answered_without_asking_the_cluster() -> None:
    producer = _Producer({0, 1}, _refused)
    assert await _partitions(producer) == {0, 1}
    assert producer.asked == 0


async def test_a_topic_the_clusters_list_lacks_is_unknown() -> None:
    producer = _Producer(None, _listing("other"))
    with pytest.raises(aiokafka_errors.UnknownTopicOrPartitionError):
        await _partitions(producer)
    assert producer.asked == 1


@pytest.mark.parametrize("answer", [_refused, _silent], ids=["refused", "silent"])
async def test_no_list_of_topics_is_a_retriable_timeout_naming_the_topic(
    answer: Callable[[], Awaitable[object]],
) -> None:
    with pytest.raises(aiokafka_errors.KafkaTimeoutError, match=r"'t'.*did not answer") as raised:
        await _partitions(_Producer(None, answer))
    assert not isinstance(raised.value, aiokafka_errors.UnknownTopicOrPartitionError)
    assert isinstance(raised.value.__cause__, aiokafka_errors.UnknownTopicOrPartitionError)


async def test_a_topic_listed_after_all_is_retried_not_refused() -> None:
    with pytest.raises(aiokafka_errors.KafkaTimeoutError, match="not there yet"):
        await _partitions(_Producer(None, _listing("t")))
