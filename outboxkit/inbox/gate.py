"""Per-partition retry holds: a failed message blocks only its own partition, in order.

After a failure the adapter pauses the partition and seeks back to the failed offset; the gate
remembers when to resume. Until the failed offset comes back, later messages of that partition
that were already fetched are dropped (the seek delivers them again), so order is kept and the
consumer never leaves its group. Pure logic: the clock is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

TopicPartitionKey = tuple[str, int]


@dataclass
class _Hold:
    offset: int
    due: float
    resumed: bool = False


class PartitionGate:
    def __init__(self) -> None:
        self._holds: dict[TopicPartitionKey, _Hold] = {}

    def hold(self, tp: TopicPartitionKey, offset: int, due: float) -> None:
        self._holds[tp] = _Hold(offset, due)

    def due(self, now: float) -> list[tuple[TopicPartitionKey, int]]:
        """Partitions whose back-off has elapsed: resume them (and seek to the offset)."""
        ready = []
        for tp, hold in self._holds.items():
            if not hold.resumed and hold.due <= now:
                hold.resumed = True
                ready.append((tp, hold.offset))
        return ready

    def accept(self, tp: TopicPartitionKey, offset: int) -> bool:
        """Whether a fetched message may be processed now."""
        hold = self._holds.get(tp)
        if hold is None:
            return True
        if not hold.resumed or offset != hold.offset:
            return False
        del self._holds[tp]
        return True

    def next_due(self) -> float | None:
        pending = [h.due for h in self._holds.values() if not h.resumed]
        return min(pending) if pending else None

    def forget(self, tps: list[TopicPartitionKey]) -> None:
        """Drop holds of revoked partitions (their new owner starts from the committed offset)."""
        for tp in tps:
            self._holds.pop(tp, None)

    @property
    def held(self) -> frozenset[TopicPartitionKey]:
        return frozenset(self._holds)
