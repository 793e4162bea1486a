"""An offset commit the broker never answers does not hold the confluent-kafka consumer.

librdkafka waits for ever for the answer to a commit that was in flight when its broker went
away, and the client's later polls and its close wait with it (the inbox's sync consumer then
logged nothing and ignored SIGTERM, once in CI). Here the broker is frozen (SIGSTOP) while the
commit is sent, so the commit is never answered while it is bounded: it fails after
``commit_seconds`` (the session timeout and a margin; shortened here), the next poll gives the
client up (its partitions handed back as lost) and subscribes a new one, which takes the
partition again once the broker is back; a close after an unanswered commit returns at once.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import TopicPartition

from outboxkit.devstack import DevStack
from outboxkit.errors import PublishError
from outboxkit.kafka.api import ConsumedRecord
from outboxkit.kafka.api import TopicPartition as TP
from outboxkit.kafka.confluent_consumer import ConfluentGroupConsumer
from outboxkit.kafka.confluent_log_bounds import MARGIN_SECONDS
from outboxkit.settings import KafkaSettings
from tests.integration.inbox_support import produce
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]
COMMIT_SECONDS = 2.0  # the bound, shortened for the test
SESSION = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}


class _Member:
    """A group member and what its rebalance callbacks were told."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.assigned: list[list[TP]] = []
        self.revoked: list[list[TP]] = []
        self.records: list[ConsumedRecord] = []
        group = f"g-{uuid.uuid4().hex[:8]}"
        self.consumer = ConfluentGroupConsumer(
            KafkaSettings(bootstrap=bootstrap), group, config=SESSION
        )
        self.consumer.commit_seconds = COMMIT_SECONDS
        self.consumer.subscribe([topic], self.assigned.append, self._revoke)

    def _revoke(self, partitions: list[TP]) -> dict[TP, int]:
        self.revoked.append(partitions)
        return {}

    def poll_until(self, done: Callable[[], bool], what: str) -> None:
        def step() -> bool:
            self.records += self.consumer.poll(0.2, 10)
            return done()

        wait_for(step, what=what, timeout=60)


@pytest.fixture
def frozen_kafka(outboxkit_stack: DevStack) -> Iterator[Callable[[], None]]:
    """``freeze()`` SIGSTOPs the stack's broker; it is thawed whatever happens."""
    kafka = outboxkit_stack.kafka
    if kafka is None:
        pytest.skip("external Kafka: cannot freeze it")
    try:
        yield kafka.freeze
    finally:
        kafka.thaw()


def _offsets(member: _Member) -> list[int]:
    return [r.offset for r in member.records]


def _unanswered_commit(member: _Member, tp: TP, freeze: Callable[[], None]) -> float:
    """Freeze the broker, commit: the seconds until the commit failed as unanswered."""
    freeze()
    began = time.monotonic()
    with pytest.raises(PublishError, match=f"no answer within {COMMIT_SECONDS:g} s"):
        member.consumer.commit({tp: 1})
    return time.monotonic() - began


def test_an_unanswered_commit_replaces_the_client_which_takes_the_partition_again(
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    outboxkit_stack: DevStack,
    frozen_kafka: Callable[[], None],
) -> None:
    topic = outboxkit_topic()
    tp = (topic, 0)
    produce(outboxkit_kafka_bootstrap, topic, [(b"k", b"v", []) for _ in range(3)])
    member = _Member(outboxkit_kafka_bootstrap, topic)
    try:
        member.poll_until(lambda: len(member.records) == 3, "the three records")
        took = _unanswered_commit(member, tp, frozen_kafka)
        assert COMMIT_SECONDS <= took < COMMIT_SECONDS + 3, took
        # Given up untouched: no commit is sent on it, it has no assignment.
        with pytest.raises(PublishError, match="being replaced"):
            member.consumer.commit({tp: 1})
        # Not asked either: the inbox reads a held partition's bounds before each seek back,
        # and librdkafka ignored the read's timeout here (held for over 300 s).
        began = time.monotonic()
        with pytest.raises(PublishError, match="being replaced"):
            member.consumer.log_bounds(tp, 5.0)
        assert time.monotonic() - began < 1.0
        assert member.consumer.assignment() == set()
        assert member.revoked == []
        member.consumer.poll(0, 10)  # replaces it
        assert member.revoked == [[tp]]  # lost: nothing was committed for it
        assert outboxkit_stack.kafka is not None
        outboxkit_stack.kafka.thaw()
        member.records.clear()
        member.poll_until(lambda: 2 in _offsets(member), "the last record again, new client")
        assert member.assigned[-1] == [tp]
        # From the start, or from 1 if the given-up commit was answered once the broker was back.
        assert _offsets(member) in ([0, 1, 2], [1, 2])
        member.consumer.commit({tp: 3})
        assert member.consumer.committed([tp], timeout=10) == {tp: 3}
    finally:
        member.consumer.close()


def test_a_close_after_an_unanswered_commit_returns_at_once(
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    frozen_kafka: Callable[[], None],
) -> None:
    topic = outboxkit_topic()
    produce(outboxkit_kafka_bootstrap, topic, [(b"k", b"v", [])])
    member = _Member(outboxkit_kafka_bootstrap, topic)
    member.poll_until(lambda: len(member.records) == 1, "the record")
    _unanswered_commit(member, (topic, 0), frozen_kafka)
    began = time.monotonic()
    member.consumer.close()
    assert time.monotonic() - began < 1.0


def test_the_log_bounds_of_a_frozen_broker_are_not_waited_for_past_their_timeout(
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    frozen_kafka: Callable[[], None],
) -> None:
    """The inbox reads a held partition's bounds before each seek back: a broker that stopped
    answering (no commit in flight) must cost that read its timeout, not hold the loop."""
    topic = outboxkit_topic()
    produce(outboxkit_kafka_bootstrap, topic, [(b"k", b"v", [])])
    member = _Member(outboxkit_kafka_bootstrap, topic)
    try:
        member.poll_until(lambda: len(member.records) == 1, "the record")
        frozen_kafka()
        began = time.monotonic()
        with pytest.raises(PublishError):
            member.consumer.log_bounds((topic, 0), 2.0)
        assert time.monotonic() - began < 4.0
    finally:
        member.consumer.close()


def test_log_bounds_held_by_an_unanswered_commit_give_the_client_up(
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    frozen_kafka: Callable[[], None],
) -> None:
    """A synchronous commit waiting on a broker that stopped answering held
    ``get_watermark_offsets`` past its timeout for minutes (>300 s here, where the inbox's
    commit had already given the client up: the guard above). Were it asked in that window,
    the read is bounded all the same, and the client given up as after an unanswered commit.
    (An asynchronous commit in flight, a revocation's, did not hold it: its timeout held.)"""
    topic = outboxkit_topic()
    tp = (topic, 0)
    produce(outboxkit_kafka_bootstrap, topic, [(b"k", b"v", [])])
    member = _Member(outboxkit_kafka_bootstrap, topic)
    try:
        member.poll_until(lambda: len(member.records) == 1, "the record")
        frozen_kafka()
        inner = member.consumer._consumer
        offsets = [TopicPartition(topic, 0, 1)]

        def commit() -> None:
            with contextlib.suppress(Exception):
                inner.commit(offsets=offsets, asynchronous=False)

        threading.Thread(target=commit, daemon=True).start()  # as the inbox's committer
        began = time.monotonic()
        with pytest.raises(PublishError, match="being replaced"):
            member.consumer.log_bounds(tp, 2.0)
        assert time.monotonic() - began < 2.0 + MARGIN_SECONDS + 1.0
        assert member.consumer.assignment() == set()  # given up: replaced at the next poll
    finally:
        member.consumer.close()
