"""Which partitions a takeover reads for a shard's checkpoints (the real-broker case is in
tests/fault/test_relay_checkpoint_partitions.py): partitions only get added, so a checkpoint
written with today's count on the shard's partition is the newest; otherwise each partition an
older count put the shard on is read too, and the newest checkpoint wins."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from outboxkit.kafka.api import TopicInfo
from outboxkit.relay.checkpoint import Checkpoint, CheckpointTopic, checkpoint_key

EVENT = "00000000-0000-0000-0000-000000000001"


class _Kafka:
    timeout = 10.0

    def __init__(self, partitions: int, values: dict[int, dict[bytes, bytes]]) -> None:
        self.partitions = partitions
        self.values = values  # partition -> key -> value
        self.read: list[int] = []
        self.asked = 0  # partition counts asked

    def admin(self) -> Any:
        kafka = self

        class _Admin:
            async def describe_topic(self, topic: str) -> TopicInfo:
                kafka.asked += 1
                return TopicInfo(topic, kafka.partitions)

            async def close(self) -> None:
                return None

        return _Admin()

    def checkpoint_reader(self) -> Any:
        kafka = self

        class _Reader:
            async def last_values(
                self, topic: str, partition: int, keys: Collection[bytes]
            ) -> dict[bytes, bytes]:
                kafka.read.append(partition)
                found = kafka.values.get(partition, {})
                return {k: v for k, v in found.items() if k in keys}

            async def close(self) -> None:
                return None

        return _Reader()


def _value(token: int, row: int, partitions: int, slot: int = 0) -> bytes:
    return Checkpoint("g", 5, token, ((row, EVENT),), slot, 0, partitions).encode()


async def _committed(kafka: _Kafka, started_with: int, slots: int = 1) -> list[Checkpoint]:
    checkpoints = CheckpointTopic(kafka, "ckpt")  # type: ignore[arg-type]
    checkpoints._partitions = started_with  # the count when this process started
    return await checkpoints.all_committed("g", 5, slots)


async def test_a_checkpoint_written_with_todays_count_is_read_on_the_shards_partition_only() -> (
    None
):
    kafka = _Kafka(4, {1: {b"g/5": _value(7, 1, 4)}, 0: {b"g/5": _value(3, 0, 1)}})
    [found] = await _committed(kafka, 4)
    assert (found.token, found.rows[0][0], found.partitions) == (7, 1, 4)
    assert kafka.read == [1]  # 5 % 4; the stale one on partition 0 (5 % 1) is not even read


async def test_partitions_added_since_the_last_checkpoint_are_all_read_newest_wins() -> None:
    """Written with 1 partition (on 0), then the count went to 2 (5 % 2 = 1) and 3 (5 % 3 = 2):
    a process started before the change still asks the count at the takeover."""
    kafka = _Kafka(3, {0: {b"g/5": _value(3, 0, 1)}, 1: {b"g/5": _value(4, 1, 2)}})
    [found] = await _committed(kafka, 1)
    assert (found.token, found.rows[0][0]) == (4, 1)
    assert sorted(kafka.read) == [0, 1, 2]


async def test_a_checkpoint_from_before_counts_were_recorded_reads_every_candidate() -> None:
    older = Checkpoint("g", 5, 9, ((9, EVENT),), 0, 2).encode()  # no "partitions": 0
    body = older.replace(b', "partitions": 0', b"")
    kafka = _Kafka(2, {1: {b"g/5": body}})
    [found] = await _committed(kafka, 2)
    assert (found.token, found.seq, found.partitions) == (9, 2, 0)
    assert sorted(kafka.read) == [0, 1]


async def test_every_slot_keeps_its_newest_and_they_come_oldest_first() -> None:
    slot1 = checkpoint_key("g", 5, 1)
    kafka = _Kafka(
        3,  # 5 % 3 = 2: nothing there yet
        {
            0: {b"g/5": _value(3, 0, 1), slot1: _value(4, 10, 1, slot=1)},
            1: {b"g/5": _value(5, 1, 2)},
        },
    )
    found = await _committed(kafka, 1, slots=2)
    assert [(c.slot, c.token) for c in found] == [(1, 4), (0, 5)]


async def test_the_count_is_asked_once_per_term_and_a_new_term_sees_partitions_added() -> None:
    kafka = _Kafka(1, {0: {b"g/5": _value(3, 0, 1)}})
    checkpoints = CheckpointTopic(kafka, "ckpt")  # type: ignore[arg-type]
    checkpoints._partitions = 1
    for _ in range(3):  # the term's producer lives (after a parked row, a transient error)
        await checkpoints.all_committed("g", 5, 1, token=3)
    assert kafka.asked == 1
    kafka.partitions = 2
    [found] = await checkpoints.all_committed("g", 5, 1, token=4)  # the next term
    assert (kafka.asked, found.token) == (2, 3)
    assert checkpoints.request(found).partition == 1  # written on 5 % 2 from now on
