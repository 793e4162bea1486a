"""Offsets settled but not yet committed, for interval (batched) offset commits.

Committing late is always safe here: every settled outcome is already durable in PostgreSQL,
so a redelivery after a crash is recognised and skipped. ``interval == 0`` means "commit each
message synchronously" and this class is not used. Pure logic: the clock is passed in.
"""

from __future__ import annotations

TopicPartitionKey = tuple[str, int]


class PendingOffsets:
    def __init__(self, interval: float, now: float) -> None:
        self.interval = interval
        self._next_commit_at = now + interval
        self._pending: dict[TopicPartitionKey, int] = {}

    def settle(self, tp: TopicPartitionKey, next_offset: int) -> None:
        self._pending[tp] = max(next_offset, self._pending.get(tp, -1))

    def due(self, now: float) -> dict[TopicPartitionKey, int]:
        """Everything pending, if the interval elapsed (then the timer restarts)."""
        if now < self._next_commit_at:
            return {}
        self._next_commit_at = now + self.interval
        return self.take()

    def take(self, tps: list[TopicPartitionKey] | None = None) -> dict[TopicPartitionKey, int]:
        """Remove and return the pending offsets (of ``tps`` only, if given)."""
        keys = list(self._pending) if tps is None else [tp for tp in tps if tp in self._pending]
        return {tp: self._pending.pop(tp) for tp in keys}
