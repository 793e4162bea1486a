"""How many rows the next claim asks for: adaptive between a latency and a throughput setting.

An idle relay claims ``batch_size`` rows (small: the claim and its Kafka send are short, so a
row written alone goes out at once). While claims come back full, the shard has a backlog and
each claim is a database round trip plus the Python work of its rows, so the next one asks for
twice as many, up to ``max_batch_size``: fewer round trips per row. A short claim means the shard
is drained and the size falls back to ``batch_size`` at once. The byte cap (``max_batch_bytes``)
applies to every claim whatever its row count, so memory stays bounded by the same setting.
"""

from __future__ import annotations

from outboxkit.settings import RelaySettings


class ClaimSizer:
    """Pure decision, no I/O: fed with what each claim asked for and what came back."""

    def __init__(self, low: int, high: int, max_bytes: int) -> None:
        self.low = low
        self.high = max(low, high)
        self._max_bytes = max_bytes
        self.size = low
        self.full = False  # the last claim came back full (rows or bytes): there is a backlog
        self.max_rows = self.high  # rows of one transaction (of several claims)
        self.max_ms = 0.0  # how long one transaction may take more claims; 0: one claim each
        self._uncapped: tuple[int, int, int] | None = None  # (low, high, max_rows) before a cap

    @classmethod
    def for_relay(cls, config: RelaySettings) -> ClaimSizer:
        """The relay's sizer. No claim asks for more rows than one transaction may carry,
        ``batch_size`` included: a transaction of one claim would else pass
        ``transaction_max_rows`` (500 rows with a cap of 100)."""
        max_rows = config.transaction_max_rows
        low, high = min(config.batch_size, max_rows), min(config.max_batch_size, max_rows)
        sizer = cls(low, high, config.max_batch_bytes)
        sizer.max_rows, sizer.max_ms = max_rows, config.transaction_max_ms
        return sizer

    def observe(self, asked: int, rows: int, claimed_bytes: int, *, grow: bool = True) -> None:
        """Record one claim that asked for ``asked`` rows and returned ``rows`` of
        ``claimed_bytes`` (as the claim counts them against the cap); with ``grow=False`` only
        whether it came back full (the size stays)."""
        # The claim stops before the row that would pass the byte cap, so a claim cut by it
        # holds at least half the cap unless one row is larger than the rest of it.
        self.full = rows >= asked or (rows > 0 and claimed_bytes >= self._max_bytes // 2)
        if not grow:
            return
        if self.full:
            self.size = min(self.high, self.size * 2)
        else:
            self.size = self.low

    def cap(self, rows: int) -> None:
        """No claim nor transaction of more than ``rows`` from now on (a checkpoint too large),
        nor of more than the settings allow: a larger ``rows`` lifts an earlier cap that far."""
        if self._uncapped is None:
            self._uncapped = (self.low, self.high, self.max_rows)
        low, high, max_rows = self._uncapped
        self.max_rows = min(max_rows, rows)
        self.low, self.high = min(low, rows), min(high, rows)
        self.size = min(max(self.size, self.low), self.high)

    @property
    def capped(self) -> bool:
        """Transactions are held below what the settings allow."""
        return self._uncapped is not None and self.max_rows < self._uncapped[2]

    def reset(self) -> None:
        """Back to the latency setting (after a permanent error: the retry stays small)."""
        self.size = self.low

    def next_of_transaction(self, rows: int, elapsed: float) -> int:
        """Rows of the next claim of a transaction open for ``elapsed`` seconds (``rows`` so far);
        0: it commits. Only under backlog: a claim that came back short (fewer rows than asked
        for, and not cut by the byte cap) means the shard is drained, so it commits at once."""
        if self.max_ms <= 0 or not self.full or elapsed * 1000 >= self.max_ms:
            return 0
        return self.next_in_transaction(rows, self.max_rows)

    def next_in_transaction(self, rows: int, max_rows: int) -> int:
        """Rows the next claim of an open transaction (``rows`` so far) may ask for; 0: commit.

        The transaction is filled up to ``max_rows``, but a remainder below ``batch_size`` is
        not worth another claim: the transaction commits instead.
        """
        room = max_rows - rows
        return min(self.size, room) if room >= self.low else 0
