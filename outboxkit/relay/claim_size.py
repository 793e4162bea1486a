"""How many rows the next claim asks for: adaptive between a latency and a throughput setting.

An idle relay claims ``batch_size`` rows (small: the claim and its Kafka send are short, so a
row written alone goes out at once). While claims come back full, the shard has a backlog and
each claim is a database round trip plus the Python work of its rows, so the next one asks for
twice as many, up to ``max_batch_size``: fewer round trips per row. A short claim means the shard
is drained and the size falls back to ``batch_size`` at once. The byte cap (``max_batch_bytes``)
applies to every claim whatever its row count, so memory stays bounded by the same setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class _Sized(Protocol):
    @property
    def payload(self) -> bytes: ...


class ClaimSizer:
    """Pure decision, no I/O: fed with what each claim asked for and what came back."""

    def __init__(self, low: int, high: int, max_bytes: int) -> None:
        self.low = low
        self.high = max(low, high)
        self._max_bytes = max_bytes
        self.size = low
        self.full = False  # the last claim came back full (rows or bytes): there is a backlog

    def observe(self, asked: int, claim: Sequence[_Sized], *, grow: bool = True) -> None:
        """Record one claim that asked for ``asked`` rows and returned ``claim``; with
        ``grow=False`` only whether it came back full (the size stays)."""
        self.full = len(claim) >= asked or self._cut_by_bytes(claim)
        if not grow:
            return
        if self.full:
            self.size = min(self.high, self.size * 2)
        else:
            self.size = self.low

    def reset(self) -> None:
        """Back to the latency setting (after a permanent error: the retry stays small)."""
        self.size = self.low

    def _cut_by_bytes(self, claim: Sequence[_Sized]) -> bool:
        # The claim SQL stops before the row that would pass the cap, so a claim cut by it holds
        # at least half the cap unless one row is larger than the rest of it: half is the test.
        return bool(claim) and sum(len(r.payload) for r in claim) >= self._max_bytes // 2

    def next_in_transaction(self, rows: int, max_rows: int) -> int:
        """Rows the next claim of an open transaction (``rows`` so far) may ask for; 0: commit.

        The transaction is filled up to ``max_rows``, but a remainder below ``batch_size`` is
        not worth another claim: the transaction commits instead.
        """
        room = max_rows - rows
        return min(self.size, room) if room >= self.low else 0
