"""The PostgreSQL connections of one relay process, bounded whatever the number of shards.

Per process at most: one *standby* connection (every lease attempt of a shard not held, in
turn), one *lease* connection (every held lease renewed in ONE statement, and releases), one
*data* connection per held shard, and the LISTEN and status-sampling connections. The data
connection stays per shard: it carries the shard's batch loop (claim, fenced marks, retention),
and sharing it would make a shard wait for a connection mid-batch while its lease runs. What
bounds data connections is ``max_shards_per_process``: a process holds at most that many shards
and leaves the rest to other processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg

from outboxkit import db
from outboxkit.db.availability import with_pooler_hint
from outboxkit.futures import retrieved
from outboxkit.log_limit import LimitedLines, normalised, one_line
from outboxkit.relay.lease import LeaseStore, LeaseTerm
from outboxkit.relay.standby import LazyConnection, StandbyConnection
from outboxkit.settings import Settings

logger = logging.getLogger("outboxkit.relay.connections")
T = TypeVar("T")


@dataclass
class _Held:
    term: LeaseTerm
    wake: asyncio.Event  # the worker's: set when its term is lost, so it stops at once
    lost: asyncio.Event = field(default_factory=asyncio.Event)


class ProcessLeases:
    """Lease attempts, renewals and releases of every shard worker of one process."""

    def __init__(
        self,
        settings: Settings,
        leases: LeaseStore | None = None,
        connections: db.OpenConnections | None = None,
    ) -> None:
        self._config = settings.relay
        self._leases = leases or LeaseStore(settings.schema_name)
        # Every connection of the process, so a stop that the database does not answer ends.
        self.connections = db.OpenConnections() if connections is None else connections
        self._owns_connections = connections is None  # then close() lets go of them
        self.standby = StandbyConnection(settings, self._leases, self.connections)
        self._held: dict[int, _Held] = {}
        self._acquiring = asyncio.Lock()  # the cap check and the attempt, as one step
        self._lock = asyncio.Lock()  # the lease connection: one statement at a time
        self._conn = LazyConnection(
            settings.database_url,
            "outboxkit-relay-leases",
            self.connections,
            **settings.database.connect_options(),
        )
        self._renewer: asyncio.Task[None] | None = None
        self._capped = False  # the "at its maximum" line is logged once per episode
        self._said = LimitedLines(logger)  # the renewer's failures
        self.renewals = 0  # renewal statements sent (tests)

    @property
    def opened(self) -> int:
        """Lease connections opened so far (observability, tests)."""
        return self._conn.opened

    @property
    def held(self) -> int:
        return len(self._held)

    def _at_capacity(self) -> bool:
        cap = self._config.max_shards_per_process
        return cap is not None and len(self._held) >= cap

    async def acquire(
        self,
        group: str,
        shard: int,
        holder: str,
        ttl: float,
        wake: asyncio.Event,
        *,
        level: int = logging.INFO,
    ) -> LeaseTerm | None:
        """One attempt to take ``shard``'s lease, unless this process holds its maximum;
        ``level``: that of the line saying it was taken (DEBUG while the shard keeps failing)."""
        async with self._acquiring:
            if self._at_capacity():
                if not self._capped:
                    self._capped = True
                    logger.info(
                        "holding %d shard(s) (max_shards_per_process); shard %s and any other"
                        " not held are left to other relay processes",
                        len(self._held),
                        shard,
                    )
                return None
            self._capped = False
            term = await self.standby.acquire(group, shard, holder, ttl, level=level)
            if term is None:
                return None
            self._held[shard] = _Held(term, wake)
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew_forever(), name="lease-renewer")
        return term

    async def watch(self, term: LeaseTerm) -> None:
        """Return once ``term`` is lost (by a failed renewal or its release)."""
        held = self._held.get(term.shard)
        if held is not None and held.term is term:
            await held.lost.wait()

    async def release(self, term: LeaseTerm, *, level: int = logging.INFO) -> None:
        """Hand the shard over at once (token-conditional, so a newer holder is untouched);
        ``level``: that of the line saying so."""
        held = self._held.get(term.shard)
        if held is not None and held.term is term:
            del self._held[term.shard]
            held.lost.set()
        was_lost = term.lost_reason is not None
        with contextlib.suppress(psycopg.Error, OSError):
            try:
                # Bounded: a release hung on a dead socket (a failover) must not hold the lease
                # connection's lock, or no lease of this process would be renewed meanwhile.
                released = await self._bounded(self._release(term))
            except TimeoutError:
                async with self._lock:
                    await self._conn.drop()
                logger.warning(
                    "releasing the lease of shard %s timed out; it expires by itself", term.shard
                )
                return
            if released and not was_lost:
                logger.log(level, "released lease of shard %s", term.shard)

    async def _bounded(self, statements: Coroutine[Any, Any, T]) -> T:
        """``statements`` on the lease connection, or ``TimeoutError`` once they waited a renewal
        interval. A statement still waiting has its socket shut, so it ends at once: cancelling
        it would make psycopg ask the same server to cancel it and wait up to 10 s more (with
        the lock held). Anything else still waiting (the lock, a connect) is cancelled. The
        server may still run a statement it had received (a renewal of our own lease: benign)."""
        interval = self._config.lease_renew_interval
        task = asyncio.ensure_future(statements)
        task.add_done_callback(retrieved)
        shut = False
        try:
            await asyncio.wait({task}, timeout=interval)
            if not task.done():
                shut = self._shut()  # a statement waiting ends at once
                await asyncio.wait({task}, timeout=interval)
        except asyncio.CancelledError:  # ours: the statement is shut, not cancelled
            if not task.done() and not self._shut():
                task.cancel()
            raise
        if not task.done():
            task.cancel()  # still waiting for the lock or a connect: nothing sent to shut
            await asyncio.wait({task})  # raises our own cancellation, not the task's
        if task.cancelled():
            raise TimeoutError(f"no answer within {interval:g} s")
        try:
            return task.result()
        except (psycopg.OperationalError, OSError) as exc:
            if shut:
                raise TimeoutError(f"no answer within {interval:g} s") from exc
            raise

    def _shut(self) -> bool:
        try:
            return self._conn.shut()
        except OSError:  # out of descriptors: the task is cancelled instead
            return False

    async def _release(self, term: LeaseTerm) -> bool:
        async with self._lock:
            return await self._leases.release(await self._conn.get(), term)

    async def _renew_forever(self) -> None:
        """Every ``lease_renew_interval``: one statement renews every held lease.

        An error is not a loss: each term's local trust deadline decides; we retry sooner.
        """
        interval = self._config.lease_renew_interval
        delay = interval
        while True:
            await asyncio.sleep(delay)
            delay = interval
            held = [h for h in self._held.values() if h.term.lost_reason is None]
            if not held:
                continue
            try:
                # A hung statement must not outlive the interval: drop it and reconnect.
                lost = await self._bounded(self._renew([h.term for h in held]))
            except Exception as exc:  # the renewer must outlive any error
                for each in held:  # terms the failed pass still marked lost (lease.renew_many)
                    if each.term.lost_reason is not None:
                        each.lost.set()
                        each.wake.set()
                async with self._lock:
                    await self._conn.drop()
                delay = min(interval / 2, 1.0)
                error = one_line(with_pooler_hint(f"{type(exc).__name__}: {exc}", exc))
                self._said.log(  # while the database is away: once a minute, with a count
                    logging.WARNING,
                    normalised(error),
                    "lease renewal of %d shard(s) errored: %s; retrying in %.1fs",
                    len(held),
                    error,
                    delay,
                )
                continue
            self._said.answered()
            self._said.end(logging.WARNING, "lease renewals answered again after %.1f s")
            for each in held:
                if each.term in lost:
                    logger.warning("lease renewal of shard %s failed", each.term.shard)
                    each.lost.set()
                    each.wake.set()

    async def _renew(self, terms: list[LeaseTerm]) -> list[LeaseTerm]:
        groups: dict[tuple[str, str, float], list[LeaseTerm]] = {}
        for term in terms:
            groups.setdefault((term.group, term.holder, term.ttl), []).append(term)
        lost: list[LeaseTerm] = []
        async with self._lock:
            conn = await self._conn.get()
            for same in groups.values():
                self.renewals += 1
                lost += await self._leases.renew_many(conn, same)
        return lost

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renewer
        async with self._lock:
            await self._conn.drop()
        await self.standby.close()
        if self._owns_connections:
            self.connections.close()
