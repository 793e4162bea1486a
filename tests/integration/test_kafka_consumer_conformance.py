"""The consumer and sender seam (``outboxkit.kafka.api``), one suite over both client libraries.

Group members and senders come from ``KafkaClients`` exactly as the inbox adapters get them; the
records are produced and read back with a raw client.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from outboxkit.errors import PermanentPublishError
from tests.integration.inbox_support import (
    GroupMember,
    Sender,
    poll_members,
    produce,
)
from tests.support.topics import read_topic

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]


@pytest.fixture(params=["confluent", "aiokafka"])
def client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def member(client: str, outboxkit_kafka_bootstrap: str) -> Iterator[Callable[[str], GroupMember]]:
    made: list[GroupMember] = []

    def make(group: str) -> GroupMember:
        made.append(GroupMember(client, outboxkit_kafka_bootstrap, group))
        return made[-1]

    yield make
    for each in made:
        each.close()


def _messages(count: int, start: int = 0) -> list[tuple[bytes | None, bytes, list[Any]]]:
    return [
        (f"k{n}".encode(), f"v{n}".encode(), [("h", f"{n}".encode()), ("empty", None)])
        for n in range(start, start + count)
    ]


def _offsets(records: list[Any]) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in records]


def test_records_arrive_whole_and_a_committed_offset_is_where_the_group_resumes(
    member: Callable[[str], GroupMember],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    before_ms = int(time.time() * 1000) - 60_000
    produce(outboxkit_kafka_bootstrap, topic, _messages(3))
    first = member(group)
    first.subscribe([topic])
    records = poll_members([first], lambda got: len(got) >= 3)
    assert first.call("assignment") == {(topic, 0)}
    assert _offsets(records) == [(0, 0), (0, 1), (0, 2)]
    assert (records[1].topic, records[1].key, records[1].value) == (topic, b"k1", b"v1")
    assert records[1].headers == (("h", b"1"), ("empty", None))
    assert records[1].timestamp_ms is not None
    assert records[1].timestamp_ms > before_ms
    first.call("commit", {(topic, 0): 2})
    first.close()
    second = member(group)
    second.subscribe([topic])
    assert _offsets(poll_members([second], lambda got: got))[0] == (0, 2)


def test_a_member_closed_then_subscribed_again_rejoins_from_the_committed_offset(
    member: Callable[[str], GroupMember],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """The inbox replaces a client that keeps refusing a seek back to a held record by closing
    the member and subscribing it again: a new client, starting from the committed offset."""
    topic = outboxkit_topic()
    produce(outboxkit_kafka_bootstrap, topic, _messages(3))
    one = member(f"g-{uuid.uuid4().hex[:8]}")
    one.subscribe([topic])
    poll_members([one], lambda got: len(got) >= 3)
    one.call("commit", {(topic, 0): 1})
    one.call("close")
    one.subscribe([topic])
    again = poll_members([one], lambda got: len(got) >= 2)
    assert _offsets(again) == [(0, 1), (0, 2)]
    assert one.call("assignment") == {(topic, 0)}
    assert one.assigned[-1] == [(topic, 0)]


def test_a_closing_member_calls_back_no_more(
    member: Callable[[str], GroupMember],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """The inbox commits and forgets what a member owns before it closes it to subscribe a new
    client: a rebalance callback of the closing one (its revocation) is not the inbox's."""
    topic = outboxkit_topic()
    produce(outboxkit_kafka_bootstrap, topic, _messages(1))
    one = member(f"g-{uuid.uuid4().hex[:8]}")
    one.subscribe([topic])
    poll_members([one], lambda got: len(got) >= 1)
    before = (list(one.assigned), list(one.revoked))
    one.call("close")
    assert (one.assigned, one.revoked) == before


def test_pause_seek_resume_and_partitions_not_assigned_are_ignored(
    member: Callable[[str], GroupMember],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    produce(outboxkit_kafka_bootstrap, topic, _messages(3))
    one = member(f"g-{uuid.uuid4().hex[:8]}")
    one.subscribe([topic])
    poll_members([one], lambda got: len(got) >= 3)
    one.call("pause", [(topic, 0), ("elsewhere", 7)])
    assert one.call("seek", ("elsewhere", 7), 0) is False  # not assigned: no position to set
    produce(outboxkit_kafka_bootstrap, topic, _messages(1, start=3))
    quiet_until = time.monotonic() + 2
    while time.monotonic() < quiet_until:
        assert one.poll(0.2) == []  # paused: nothing, not even the new record
    assert one.call("seek", (topic, 0), 1) is True
    one.call("resume", [(topic, 0)])
    again = poll_members([one], lambda got: len(got) >= 3)
    assert _offsets(again) == [(0, 1), (0, 2), (0, 3)]


def test_a_paused_partition_consumes_again_when_a_rebalance_gives_it_back(
    member: Callable[[str], GroupMember],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """The seam's promise the inbox relies on: after an assignment every assigned partition is
    consuming, even one the application had paused before it was revoked."""
    topic = outboxkit_topic(partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    stays = member(group)
    stays.subscribe([topic])
    poll_members([stays], lambda _: stays.call("assignment") == {(topic, 0), (topic, 1)})
    stays.call("pause", [(topic, 0), (topic, 1)])
    joins = member(group)
    joins.subscribe([topic])
    poll_members([stays, joins], lambda _: joins.call("assignment"))
    joins.close()
    poll_members([stays], lambda _: len(stays.call("assignment")) == 2)
    for partition in (0, 1):
        produce(outboxkit_kafka_bootstrap, topic, _messages(1), partition=partition)
    records = poll_members([stays], lambda got: {r.partition for r in got} == {0, 1})
    assert sorted(_offsets(records)) == [(0, 0), (1, 0)]
    assert len(stays.revoked) >= 2  # both rebalances revoked (eager protocol)


def test_offsets_a_revocation_hands_back_are_committed_before_the_partition_goes(
    member: Callable[[str], GroupMember],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    produce(outboxkit_kafka_bootstrap, topic, _messages(3))
    first = member(group)
    first.subscribe([topic])
    poll_members([first], lambda got: len(got) >= 3)
    first.commit_on_revoke = {(topic, 0): 3}  # settled, not committed yet
    second = member(group)
    second.subscribe([topic])
    poll_members([first, second], lambda _: first.revoked and second.assigned)
    produce(outboxkit_kafka_bootstrap, topic, _messages(1, start=3))
    records = poll_members([first, second], lambda got: got)
    assert _offsets(records) == [(0, 3)]  # whoever owns it now starts after the handed-back 3


def test_committed_offsets_are_read_back_whichever_member_committed_them(
    member: Callable[[str], GroupMember],
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """A rejoined member reads the group's committed offsets of the partitions it held, to
    learn whether another member settled the held record meanwhile."""
    topic = outboxkit_topic(partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    both = [(topic, 0), (topic, 1)]
    produce(outboxkit_kafka_bootstrap, topic, _messages(3))
    first = member(group)
    first.subscribe([topic])
    poll_members([first], lambda got: len(got) >= 3)
    assert first.call("committed", both, 10.0) == {}  # none yet: left out
    first.call("commit", {(topic, 0): 2})
    assert first.call("committed", both, 10.0) == {(topic, 0): 2}
    second = member(group)
    second.subscribe([topic])
    poll_members([first, second], lambda _: second.assigned and len(first.assigned) >= 2)
    [(_, partition)] = second.call("assignment")
    second.call("commit", {(topic, partition): 1})
    assert first.call("committed", both, 10.0)[(topic, partition)] == 1  # the other's commit
    assert first.call("committed", [], 10.0) == {}


def test_the_sender_delivers_a_record_and_names_a_permanent_failure(
    client: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    sender = Sender(client, outboxkit_kafka_bootstrap)
    try:
        sender.send(topic, b"key", b"value", [("dlq-error", b"boom"), ("none", None)])
        with pytest.raises(PermanentPublishError, match="publish to"):
            sender.send(topic, None, b"x" * (2 * 1024 * 1024), [])
    finally:
        sender.close()
    [record] = read_topic(outboxkit_kafka_bootstrap, topic, expect=1, quiet=0.5)
    assert (record.key(), record.value()) == (b"key", b"value")
    assert record.headers() == [("dlq-error", b"boom"), ("none", None)]
