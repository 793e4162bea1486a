"""Bounded outbox growth beyond published rows: the shard holder purges discarded rows (and,
when configured, rows parked for longer than a long window) in small fenced batches.

Published rows have their own retention (``retention_seconds``, every few poll intervals:
:meth:`Housekeeping.retain_published`);
these rows are rare, so they are swept far less often
(``housekeeping_interval``). Deleting a parked row gives up on it, like ``outbox discard``:
same-key rows behind it then flow again. Shard 0's holder also parks pending rows of no shard
(a shard number outside the count, written by hand): no relay would ever claim them; and its
sweeps (like its retention of published rows) take the rows of no shard too, such as those a
lowered shard count left behind, which no holder would otherwise delete.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg

from outboxkit import db
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.lease_loss import token_check_failed
from outboxkit.relay.reader import ShardStore
from outboxkit.schema import parked_lock_name
from outboxkit.settings import OnPublish, RelaySettings

logger = logging.getLogger("outboxkit.relay.housekeeping")

Conn = psycopg.AsyncConnection[Any]

# One pass of retention deletes for at most this long (at least one batch), then the shard
# publishes again and the next pass follows at once: a backlog of expired rows (retention just
# turned on, a window lowered) took passes of many seconds, and the shard published nothing
# meanwhile (1.5 million rows: 16 s).
RETENTION_PASS_SECONDS = 0.25


class Housekeeping:
    """One shard's sweep; :meth:`run_if_due` is called from the holder's retention hook."""

    def __init__(
        self,
        config: RelaySettings,
        schema: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_parked: Callable[[int], None] = lambda count: None,
    ) -> None:
        self._config = config
        self._on_parked = on_parked  # counts rows it parks (the relay's parked counter)
        self._schema = schema
        self._queries = {  # one per state: see housekeeping_delete_discarded in relay.sql
            state: db.query("relay", f"housekeeping_delete_{state}", schema)
            for state in ("discarded", "parked")
        }
        self._park_stray = db.query("relay", "park_stray", schema)
        self._parked_lock = db.query("relay", "parked_lock", schema)
        self._lock_name = parked_lock_name(schema)
        self._clock = clock
        self._due = clock()  # the first sweep runs at the first retention hook of a term
        self.passes = 0  # completed sweeps (tests wait on it)
        self.retention_passes = 0  # completed retention passes of published rows (likewise)
        self.retention_behind = False  # the last pass stopped at its time, rows left to delete
        self._retained = 0  # deleted by passes since the last one that finished (one log line)
        self.deleted = 0

    def windows(self) -> list[tuple[str, float]]:
        """(state, keep seconds) of every state that has a retention window."""
        out = []
        if self._config.discarded_retention_seconds is not None:
            out.append(("discarded", self._config.discarded_retention_seconds))
        if self._config.parked_retention_seconds is not None:
            out.append(("parked", self._config.parked_retention_seconds))
        return out

    async def run_if_due(
        self, conn: Conn, term: LeaseTerm, stop: asyncio.Event, *, now: datetime | None = None
    ) -> int:
        """Sweep if the interval has passed: small batches, each its own short statement."""
        if self._clock() < self._due:
            return 0
        self._due = self._clock() + self._config.housekeeping_interval
        if term.shard == 0:
            await self._park_strays(conn, term, stop, now)
        total = 0
        for state, keep in self.windows():
            removed = 0  # of this state: the log line names it
            while not stop.is_set():
                deleted = await self._delete_batch(conn, term, state, keep, now)
                removed += deleted
                if deleted < self._config.retention_batch:
                    break
            total += removed
            if removed:
                logger.info(
                    "shard %s: housekeeping removed %d %s row(s) older than %ss",
                    term.shard,
                    removed,
                    state,
                    keep,
                )
        self.passes += 1
        self.deleted += total
        return total

    async def retain_published(
        self, conn: Conn, term: LeaseTerm, store: ShardStore, stop: asyncio.Event
    ) -> None:
        """Published rows past ``retention_seconds``: small batches, each its own short
        transaction (nothing to do when published rows are deleted at once), for at most
        :data:`RETENTION_PASS_SECONDS` (``retention_behind`` then says more are due)."""
        keep = self._config.retention_seconds
        if keep is None or self._config.on_publish is OnPublish.DELETE:
            return
        total, ends = 0, self._clock() + RETENTION_PASS_SECONDS
        self.retention_behind = False
        while not stop.is_set():
            deleted = await store.retention(conn, term, keep, self._config.retention_batch)
            term.check()
            total += deleted
            if deleted < self._config.retention_batch:
                break
            if self._clock() >= ends:  # more to delete: the next pass, after a batch published
                self.retention_behind = True
                break
        self.retention_passes += 1
        self._retained += total
        if self._retained and not self.retention_behind:  # one line for a backlog's passes
            logger.info(
                "shard %s: retention removed %d published row(s)", term.shard, self._retained
            )
            self._retained = 0

    async def _park_strays(
        self, conn: Conn, term: LeaseTerm, stop: asyncio.Event, now: datetime | None
    ) -> None:
        """Small batches, like the deletes: the lease row stays shared while one runs."""
        params = {**term.sql_params(now), "limit": self._config.retention_batch}
        parked = 0
        while not stop.is_set():
            row = await db.one_async(conn, self._park_stray, params)
            assert row is not None
            if not int(row[0]):
                await token_check_failed(conn, self._schema, term, "housekeeping", now=now)
            term.check()
            parked += int(row[1])
            if int(row[1]) < self._config.retention_batch:
                break
        if parked:
            self._on_parked(parked)
            logger.warning(
                "shard 0: parked %d pending row(s) of no shard (shard number outside the count;"
                " `outboxkit outbox parked` lists them, `outbox retry` gives them their key's"
                " shard)",
                parked,
            )

    async def _delete_batch(
        self, conn: Conn, term: LeaseTerm, state: str, keep: float, now: datetime | None
    ) -> int:
        params = {
            **term.sql_params(now),
            "keep_seconds": keep,
            "limit": self._config.retention_batch,
        }
        if state == "parked":  # its deletion releases held rows: after parked_lock (relay.sql)
            async with conn.transaction():
                lock = {"name": self._lock_name, "shard": term.shard}
                await db.execute_async(conn, self._parked_lock, lock)
                row = await db.one_async(conn, self._queries[state], params)
        else:
            row = await db.one_async(conn, self._queries[state], params)
        assert row is not None
        if not int(row[0]):
            await token_check_failed(conn, self._schema, term, "housekeeping", now=now)
        term.check()
        return int(row[1])
