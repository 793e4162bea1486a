"""Rows scheduled for later, kept out of the claim's walk while they wait.

Every claim walks its shard's pending rows in id order from the lowest, and reads each row whose
``deliver_after`` had not come yet below the first one due: 300,000 rows scheduled for the next
day made each claim of their shard take about 40 ms instead of 1. Once a poll interval, before a
claim, the shard's holder moves pending rows due later than :meth:`Scheduling.ahead` seconds
from now to ``scheduled``, and scheduled rows due within that back to ``pending``
(``schedule_rows`` in relay.sql, fenced like every relay write), with their ids: there, ahead of
their time, the claim's own test of ``deliver_after`` lets them go when due, in their place
among their key's due rows, as before the moves existed. A backlog's prefetched claim is dropped
when a pass is due (``ShardWorker``), so passes keep their pace under load; a pass runs only
while nothing is in flight (no Kafka transaction open, no mark outstanding).

The same pass moves rows that wait behind a parked row of their key (parked-key policy 'wait')
to ``held`` (``hold_rows``): the claim tests every keyed row it walks for a parked row of its
key, and 100,000 rows behind one parked key made each claim take about 26 ms instead of 2. A
retry or discard of the parked row brings them back to ``pending`` in its own transaction, with
their ids, so they still go before any newer row of their key.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg

from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.reader import ShardStore
from outboxkit.settings import RelaySettings

Conn = psycopg.AsyncConnection[Any]

#: Rows each way per statement: each statement is a short transaction of its own.
SCHEDULE_BATCH = 1000
#: A pass with more rows to move out lasts at most this long (at least one statement); the next
#: follows before the next claim, so a large schedule never holds the shard's publishing for
#: long. Rows coming back are all brought back in the pass, whatever it takes (about 1.7 s for
#: 100,000): one left out at its time would let newer rows of its key that are due go first.
PASS_SECONDS = 0.25
#: How far ahead of its time a row comes back, past two poll intervals and
#: ``transaction_max_ms`` (a Kafka transaction takes further claims for that long, with no pass
#: between them): the slack for a pass that a batch's publishing or its mark delays.
AHEAD_MARGIN_SECONDS = 5.0


class Scheduling:
    """One shard holder's moves of scheduled rows (:meth:`run_if_due` before each claim)."""

    def __init__(
        self,
        interval: float,
        *,
        transaction_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        batch: int = SCHEDULE_BATCH,
    ) -> None:
        self._interval, self._clock, self._batch = interval, clock, batch
        self.ahead = 2 * interval + transaction_seconds + AHEAD_MARGIN_SECONDS
        self._due = clock()  # the worker's first pass comes before its first claim
        self.passes = 0  # completed passes (tests wait on them)
        self.moved_later = 0  # rows moved to 'scheduled', over the process's life
        self.moved_due = 0  # rows moved back to 'pending'
        self.moved_held = 0  # rows moved to 'held' (behind a parked row of their key)
        self.moved_released = 0  # held rows moved back to 'pending' by the pass

    @classmethod
    def of(cls, config: RelaySettings) -> Scheduling:
        """A shard's, with the relay's poll interval and longest Kafka transaction."""
        return cls(config.poll_interval, transaction_seconds=config.transaction_max_ms / 1000)

    def due(self) -> bool:
        return self._clock() >= self._due

    async def run_if_due(
        self,
        conn: Conn,
        term: LeaseTerm,
        store: ShardStore,
        stop: asyncio.Event,
        *,
        now: datetime | None = None,
    ) -> None:
        """A pass if one is due: statements until nothing is left to move, or, with only rows
        to move out left, until the pass's time is up (the next pass then comes before the next
        claim)."""
        if not self.due():
            return
        ends, behind = self._clock() + PASS_SECONDS, False
        while not stop.is_set():
            moves = await store.schedule(conn, term, self._batch, self.ahead, now=now)
            term.check()
            self.moved_later += moves.later
            self.moved_due += moves.due
            self.moved_held += moves.held
            self.moved_released += moves.released
            behind = max(moves.later, moves.held) >= self._batch
            if max(moves.due, moves.released) >= self._batch or moves.letting_go:
                continue  # every row due (or let go) comes back before the next claim
            if not (behind or moves.walking) or self._clock() >= ends:
                break  # the walk of held keys goes on in the next pass, not at once
        self.passes += 1
        self._due = self._clock() + (0.0 if behind else self._interval)
