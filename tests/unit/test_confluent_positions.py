"""Where a confluent-kafka poll cut short by a stop goes back to: the pure tracking, and the
seek back over a stand-in client (the real one: tests/integration/test_inbox_confluent_fetch_
interrupted.py)."""

from __future__ import annotations

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from outboxkit.errors import PublishError
from outboxkit.kafka import confluent_positions as positions_module
from outboxkit.kafka.api import ConsumedRecord
from outboxkit.kafka.api import TopicPartition as TP
from outboxkit.kafka.confluent_positions import REWIND_ATTEMPTS, FetchPositions, ready

pytestmark = pytest.mark.unit

A, B, C = ("t", 0), ("t", 1), ("u", 0)


def _records(*where: tuple[TP, int]) -> list[ConsumedRecord]:
    return [ConsumedRecord(tp[0], tp[1], offset, None, b"", (), None) for tp, offset in where]


def _polled(positions: FetchPositions, *where: tuple[TP, int]) -> None:
    """A poll that ended, handing these records over."""
    assert positions.begin()
    positions.ended(_records(*where))


def test_a_poll_that_ended_is_taken_in_at_the_next_one() -> None:
    positions = FetchPositions()
    _polled(positions, (A, 4), (B, 7), (A, 5))
    assert positions.next == {}  # not yet: the caller may not have got them
    assert positions.begin()
    assert positions.next == {A: 6, B: 8}  # the offset after the last record of each
    assert positions.targets([A, B, C]) == ({A: 6, B: 8}, [C])


def test_a_poll_cut_short_hands_nothing_over_and_the_next_one_seeks_back() -> None:
    positions = FetchPositions()
    _polled(positions, (A, 4))
    assert positions.begin()  # this poll's consume() raised: ended() never came
    assert positions.cut
    assert not positions.begin()  # ... so the next poll seeks back first
    assert positions.targets([A, B]) == ({A: 5}, [B])
    assert not positions.begin()  # and keeps doing so until one ends
    positions.ended(_records((A, 5)))
    assert positions.begin()
    assert positions.next == {A: 6}


def test_taking_a_hand_over_in_twice_is_harmless() -> None:
    """A stop between taking the last hand-over in and marking the poll started leaves both."""
    positions = FetchPositions()
    _polled(positions, (A, 4))
    positions._take({A: 5})
    assert positions.begin()
    assert positions.next == {A: 5}


def test_a_seek_of_the_inbox_moves_the_position() -> None:
    positions = FetchPositions()
    _polled(positions, (A, 4), (B, 1))
    positions.sought(A, 2)  # a retry's seek back: the hand-over before it is taken in first
    assert positions.begin()
    assert positions.next == {A: 2, B: 2}
    positions.sought(B, 0)  # after a cut poll too
    assert not positions.begin()
    assert positions.targets([A, B]) == ({A: 2, B: 0}, [])


def test_an_assigned_partition_starts_again_from_its_committed_offset() -> None:
    positions = FetchPositions()
    _polled(positions, (A, 4))
    assert positions.begin()
    positions.assigned([A])  # revoked and assigned again within the poll
    positions.ended(_records((B, 0)))
    assert positions.begin()
    assert positions.targets([A, B]) == ({B: 1}, [A])
    positions.ended(_records((A, 9)))
    positions.assigned([A])  # ... or in a poll after a hand-over not yet taken in
    assert positions.begin()
    assert positions.targets([A]) == ({}, [A])


class Client:
    """The calls of confluent-kafka's Consumer the seek back makes."""

    def __init__(self, assigned: list[TP], refuse: TP | None = None) -> None:
        self.assigned = assigned
        self.refuse = refuse
        self.sought: dict[TP, int] = {}

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(*tp) for tp in self.assigned]

    def seek(self, partition: TopicPartition) -> None:
        if (partition.topic, partition.partition) == self.refuse:
            raise KafkaException(KafkaError(KafkaError._STATE))
        self.sought[partition.topic, partition.partition] = partition.offset


def _cut(positions: FetchPositions) -> None:
    assert positions.begin()  # a poll whose records never came back


def test_nothing_is_sought_after_a_poll_that_ended() -> None:
    positions, client = FetchPositions(), Client([A])
    _polled(positions, (A, 4))
    assert ready(client, positions, _no_read)  # type: ignore[arg-type]
    assert client.sought == {}


def _no_read(partitions: list[TP], timeout: float) -> dict[TP, int]:
    raise AssertionError("nothing to read")


def test_a_cut_poll_seeks_every_assigned_partition_back() -> None:
    positions, client = FetchPositions(), Client([A, B, C])
    _polled(positions, (A, 4))
    _cut(positions)
    asked: list[list[TP]] = []

    def committed(partitions: list[TP], timeout: float) -> dict[TP, int]:
        asked.append(partitions)
        return {B: 3}  # C has none: auto.offset.reset starts it

    assert ready(client, positions, committed)  # type: ignore[arg-type]
    assert asked == [[B, C]]
    assert client.sought == {A: 5, B: 3, C: OFFSET_INVALID}
    assert positions.next == {A: 5, B: 3}  # read once
    positions.ended([])
    assert positions.begin()


@pytest.mark.parametrize("fails", ["read", "seek"])
def test_a_seek_back_that_fails_fetches_nothing_and_is_tried_again(fails: str) -> None:
    positions = FetchPositions()
    client = Client([A, B], refuse=A if fails == "seek" else None)
    _polled(positions, (A, 4))
    _cut(positions)

    def committed(partitions: list[TP], timeout: float) -> dict[TP, int]:
        if fails == "read":
            raise PublishError("reading the committed offsets failed: timed out")
        return {}

    assert not ready(client, positions, committed)  # type: ignore[arg-type]
    assert positions.cut  # the next poll seeks back again
    client.refuse = None
    assert ready(client, positions, lambda partitions, timeout: {B: 0})  # type: ignore[arg-type]
    assert client.sought == {A: 5, B: 0}


def test_a_client_that_keeps_refusing_the_seek_back_is_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each failed seek back waits the poll's timeout (polled in a loop, it must not spin);
    after REWIND_ATTEMPTS in a row the client is to be replaced (``stuck``), and one that
    succeeds in between starts the count again."""
    slept: list[float] = []
    monkeypatch.setattr(positions_module.time, "sleep", slept.append)
    positions, client = FetchPositions(), Client([A, B], refuse=A)
    _polled(positions, (A, 4), (B, 2))
    _cut(positions)
    for _ in range(REWIND_ATTEMPTS - 1):
        assert not ready(client, positions, _no_read, 0.5)  # type: ignore[arg-type]
        assert not positions.stuck
    client.refuse = None
    assert ready(client, positions, _no_read, 0.5)  # type: ignore[arg-type]
    assert positions.refused == 0
    positions.ended([])  # that poll ended; the next one is cut again
    client.refuse = B
    _cut(positions)
    for _ in range(REWIND_ATTEMPTS):
        assert not ready(client, positions, _no_read, 0.5)  # type: ignore[arg-type]
    assert positions.stuck
    assert slept == [0.5] * (2 * REWIND_ATTEMPTS - 1)
