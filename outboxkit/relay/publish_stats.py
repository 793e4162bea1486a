"""Where one shard's publishing time goes: counts and wall-clock seconds per stage.

Logged when a term ends (INFO), so a benchmark or an operator can see whether transactions
carry several claims under backlog and which stage the others wait on, without a profiler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class PublishStats:
    transactions: int = 0
    claims: int = 0  # claims that found rows
    largest_claim: int = 0
    rows: int = 0
    marks: int = 0  # database marks (of a batch's rows as published) that committed
    # Seconds the publishing loop spent awaiting each stage (the others overlap with it).
    send: float = 0.0  # records handed to the client until every delivery is confirmed
    # The next claim still running after the send finished (or, when it was deferred, after
    # the commit: exactly-once without a backlog).
    claim_wait: float = 0.0
    commit: float = 0.0  # commit_transaction (exactly-once)
    _since: float = field(default_factory=time.monotonic)

    def summary(self) -> str:
        elapsed = max(time.monotonic() - self._since, 1e-9)
        per = self.claims / self.transactions if self.transactions else 0.0
        return (
            f"{self.transactions} transaction(s), {self.claims} claim(s) ({per:.1f} per"
            f" transaction, largest {self.largest_claim} rows), {self.rows} row(s) in"
            f" {elapsed:.1f} s; awaited: send {self.send:.2f} s, next claim"
            f" {self.claim_wait:.2f} s, commit {self.commit:.2f} s"
        )
