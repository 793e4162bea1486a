"""One consumer group, one inbox consumer name, members on both client libraries (a migration's
rolling deploy), on the real stack, in both directions.

A member of one client runs alone; a member of the other joins (partitions move to it mid-
stream), then the first leaves (the rest move). With both clients' default assignment
strategies the group forms (the broker picks roundrobin, the one strategy both offer), every
event's effect happens once, every row ends ``succeeded``, and each partition goes on from the
offset committed by its previous owner: nothing settled runs again (no duplicate outcome), no
record is skipped. A member whose strategies share nothing with the group's is refused with a
typed error naming what to align (``GroupProtocolError``), whichever client it is on.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from outboxkit.errors import GroupProtocolError
from outboxkit.inbox import InboxSettings, OutcomeKind, RetryPolicy
from tests.integration.inbox_support import (
    EFFECT_DDL,
    REGISTRY,
    Behaviour,
    GroupMember,
    Harness,
    fetch,
    headers_for,
    payload,
    poll_members,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
PARTITIONS = 4
PER_PARTITION = 5  # events per partition in each phase
BOUND = 90.0  # seconds within which each step must have happened
HELD_SECONDS = 600.0  # a failed event's retry delay: longer than the test
CLIENTS = ("confluent", "aiokafka")


class Stack:
    """Produces phases of events and tells what the group and the inbox look like."""

    def __init__(self, db_url: str, bootstrap: str, topic: str, group: str) -> None:
        self.db_url, self.topic, self.group = db_url, topic, group
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        self.produced: list[str] = []

    def produce_phase(self, failing: set[str] | None = None) -> list[str]:
        """``PER_PARTITION`` new events on every partition, their ids; the first of each
        partition is added to ``failing`` before any is produced."""
        ids = [str(uuid.uuid4()) for _ in range(PARTITIONS * PER_PARTITION)]
        if failing is not None:
            failing.update(_first_of_each_partition(ids))
        for n, event_id in enumerate(ids):
            value, headers = payload(f"o-{event_id[:8]}", 1), headers_for(event_id)
            partition = n // PER_PARTITION
            self.producer.produce(self.topic, value, key=b"k", headers=headers, partition=partition)
        assert self.producer.flush(30) == 0
        self.produced += ids
        return ids

    def members(self) -> tuple[str, list[set[int]]]:
        """The group's assignment strategy and each member's partitions (once it is stable)."""
        found = self.admin.describe_consumer_groups([self.group])[self.group].result(30)
        if found.state.name != "STABLE":
            return "", []
        owned = [{tp.partition for tp in m.assignment.topic_partitions} for m in found.members]
        return found.partition_assignor, owned

    def wait_members(self, count: int) -> str:
        """Wait until ``count`` members split every partition between them; the strategy."""

        def formed() -> str:
            strategy, owned = self.members()
            split = len(owned) == count and all(owned)
            return strategy if split and set().union(*owned) == set(range(PARTITIONS)) else ""

        return str(wait_for(formed, timeout=BOUND, what=f"a stable group of {count}"))

    def wait_succeeded(self, ids: list[str]) -> None:
        def done() -> bool:
            rows = fetch(
                self.db_url,
                "SELECT count(*) FROM outboxkit.inbox_message WHERE consumer = 'billing'"
                " AND state = 'succeeded' AND event_id = ANY(%s)",
                (ids,),
            )
            return bool(rows[0][0] == len(ids))

        wait_for(done, timeout=BOUND, what=f"{len(ids)} events succeeded")

    def committed(self) -> dict[int, int]:
        request = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
        futures = self.admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(self.group, request)]
        )
        found = futures[self.group].result(30).topic_partitions
        return {tp.partition: tp.offset for tp in found}


@pytest.fixture
def mixed(
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> Iterator[tuple[Stack, Callable[[str], Harness], set[str]]]:
    """A topic of four partitions; ``start(client)``: a member of one group, consumer billing,
    whose first run of an event in the (shared, growing) set fails."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    topic = outboxkit_topic(partitions=PARTITIONS)
    stack = Stack(outboxkit_db_url, outboxkit_kafka_bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}")
    failing: set[str] = set()
    # A retry far past the test: a held record comes back only when its partition is handed over.
    policy = RetryPolicy(initial_delay=HELD_SECONDS, max_delay=HELD_SECONDS)
    running: list[Harness] = []

    def start(client: str) -> Harness:
        harness = Harness(
            client,
            sa_url=sa_url,
            bootstrap=outboxkit_kafka_bootstrap,
            topics=[topic],
            settings=InboxSettings(consumer="billing", registry=REGISTRY, policy=policy),
            behaviour=Behaviour(fail_attempts=1, fail_only=failing),
            group_id=stack.group,
        )
        running.append(harness.start())
        return harness

    yield stack, start, failing
    for harness in running:
        if harness._thread.is_alive():
            harness.stop()


def _ran(harnesses: tuple[Harness, ...], ids: list[str], kind: OutcomeKind) -> set[str]:
    wanted = set(ids)
    return {
        o.event_id
        for h in harnesses
        for o in list(h.outcomes)
        if o.event_id in wanted and o.kind is kind
    }


def _first_of_each_partition(ids: list[str]) -> list[str]:
    return ids[::PER_PARTITION]


@pytest.mark.parametrize("first", CLIENTS)
def test_partitions_move_between_clients_from_the_committed_offsets(
    first: str,
    mixed: tuple[Stack, Callable[[str], Harness], set[str]],
    outboxkit_db_url: str,
) -> None:
    """Each hand-over happens with a record held for a retry on every partition (its offset is
    the committed one): the partition's new owner, on the other client, runs it at once."""
    stack, start, failing = mixed
    second = CLIENTS[1 - CLIENTS.index(first)]
    alone = stack.produce_phase(failing)
    held_alone = _first_of_each_partition(alone)
    old = start(first)
    wait_for(
        lambda: _ran((old,), held_alone, OutcomeKind.RETRY) == set(held_alone),
        timeout=BOUND,
        what="a record held on every partition",
    )
    # librdkafka offers range first: a group of confluent-kafka members alone uses it
    assert stack.wait_members(1) == ("range" if first == "confluent" else "roundrobin")
    new = start(second)
    assert stack.wait_members(2) == "roundrobin"  # the one strategy both clients offer
    stack.wait_succeeded(alone)
    wait_for(
        lambda: _ran((old, new), alone, OutcomeKind.SUCCEEDED) == set(alone),
        timeout=BOUND,
        what="the outcomes of the first phase",
    )
    assert _ran((new,), held_alone, OutcomeKind.SUCCEEDED)  # moved with its held record
    shared = stack.produce_phase()
    stack.wait_succeeded(shared)
    wait_for(
        lambda: _ran((old, new), shared, OutcomeKind.SUCCEEDED) == set(shared),
        timeout=BOUND,
        what="the outcomes of the shared phase",
    )
    assert _ran((old,), shared, OutcomeKind.SUCCEEDED)  # both own partitions
    assert _ran((new,), shared, OutcomeKind.SUCCEEDED)
    leaving = stack.produce_phase(failing)
    held_leaving = _first_of_each_partition(leaving)
    wait_for(
        lambda: _ran((old, new), held_leaving, OutcomeKind.RETRY) == set(held_leaving),
        timeout=BOUND,
        what="a record held on every partition again",
    )
    held_on_old = _ran((old,), held_leaving, OutcomeKind.RETRY)
    assert held_on_old
    old.stop()  # commits what it settled and leaves: its partitions move to the other client
    stack.wait_members(1)
    last = stack.produce_phase()
    stack.wait_succeeded(leaving + last)
    wait_for(
        lambda: _ran((new,), leaving + last, OutcomeKind.SUCCEEDED) >= held_on_old | set(last),
        timeout=BOUND,
        what="the outcomes of the last phases on the remaining member",
    )
    new.stop()

    produced, held = stack.produced, set(held_alone + held_leaving)
    effects = fetch(outboxkit_db_url, "SELECT event_id FROM public.effect")
    assert sorted(e[0] for e in effects) == sorted(produced)  # each effect exactly once
    rows = fetch(
        outboxkit_db_url,
        "SELECT event_id, state, attempts FROM outboxkit.inbox_message WHERE consumer = 'billing'",
    )
    assert sorted(rows) == sorted((e, "succeeded", 2 if e in held else 1) for e in produced)
    # Each record was settled by one member, once: nothing settled ran again (no partition went
    # back before its committed offset) and nothing was skipped; the held ones failed once.
    outcomes = [(o.event_id, o.kind) for h in (old, new) for o in h.outcomes]
    assert sorted(e for e, k in outcomes if k is OutcomeKind.SUCCEEDED) == sorted(produced)
    assert sorted(e for e, k in outcomes if k is not OutcomeKind.SUCCEEDED) == sorted(held)
    assert {k for _, k in outcomes} == {OutcomeKind.SUCCEEDED, OutcomeKind.RETRY}
    assert stack.committed() == dict.fromkeys(range(PARTITIONS), 4 * PER_PARTITION)


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "INCONSISTENT_GROUP_PROTOCOL" in r.getMessage()
    ]


def _wait_refused(
    owner: GroupMember,
    joining: GroupMember,
    client: str,
    topic: str,
    caplog: pytest.LogCaptureFixture,
) -> str:
    """The refusal as the joining member says it: aiokafka's start raises it (the worker starts
    again with a back-off), confluent-kafka's join is refused in a poll (librdkafka asks again),
    which logs it."""
    if client == "aiokafka":
        with pytest.raises(GroupProtocolError) as caught:
            joining.subscribe([topic])
        return str(caught.value)
    joining.subscribe([topic])

    def said() -> list[str]:
        owner.poll(0.1)
        joining.poll(0.1)
        return _refusals(caplog)

    return str(wait_for(said, timeout=BOUND, what="the refusal logged")[0])


@pytest.mark.parametrize("refused", CLIENTS)
def test_a_member_sharing_no_strategy_waits_with_a_typed_notice_then_joins(
    refused: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """confluent-kafka's ``cooperative-sticky`` shares nothing with aiokafka's strategies. The
    refusal lasts only while such a member is in the group (a rolling deploy, a member that
    crashed and has not timed out): the refused member is never ended for it (under a
    supervisor that would be a crash loop), it says what to align and joins once the other
    member has left."""
    caplog.set_level(logging.INFO)
    topic = outboxkit_topic(partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    sticky = {"partition.assignment.strategy": "cooperative-sticky"}
    inside = CLIENTS[1 - CLIENTS.index(refused)]
    members: list[GroupMember] = []

    def member(client: str) -> GroupMember:
        config: dict[str, Any] = sticky if client == "confluent" else {}
        members.append(GroupMember(client, outboxkit_kafka_bootstrap, group, **config))
        return members[-1]

    try:
        owner = member(inside)
        owner.subscribe([topic])
        poll_members([owner], lambda _: owner.assigned and owner.assigned[-1], timeout=BOUND)
        joining = member(refused)
        text = _wait_refused(owner, joining, refused, topic, caplog)
        assert f"group {group!r}" in text
        offered = "cooperative-sticky" if refused == "confluent" else "roundrobin"
        assert f"offers ({offered})" in text
        assert "partition.assignment.strategy" in text
        assert owner.assigned[-1]  # the group went on without it
        assert not joining.assigned
        owner.close()  # the last member it shares nothing with leaves: the refusal ends
        if refused == "aiokafka":
            joining.subscribe([topic])  # as the worker's next start does
        poll_members([joining], lambda _: joining.assigned and joining.assigned[-1], timeout=BOUND)
        assert sorted(joining.assigned[-1]) == [(topic, 0), (topic, 1)]
        if refused == "confluent":
            assert len(_refusals(caplog)) == 1  # said once a notice interval, not per poll
    finally:
        for each in members:
            each.close()
