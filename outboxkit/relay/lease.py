"""One shard's lease: acquire, renew, release by SQL, judged by the database clock.

The holder trusts its lease only until a *local monotonic* deadline: the moment the renewal was
sent plus the TTL minus a safety margin. That deadline ends before the database can see the lease
expire, so by the time a standby may take over, this process has already stopped publishing —
whatever its wall clock says. Every relay write also re-checks the token in SQL (fencing).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from outboxkit import db
from outboxkit.errors import LeaseLostError

logger = logging.getLogger("outboxkit.relay.lease")

Clock = Callable[[], float]


def trust_margin(ttl: float) -> float:
    """How long before the database expiry the holder stops trusting its lease."""
    return max(ttl * 0.25, min(1.0, ttl * 0.5))


@dataclass
class LeaseTerm:
    """A term of office: one token, trusted until ``trusted_until`` on the monotonic clock."""

    group: str
    shard: int
    holder: str
    token: int
    ttl: float
    trusted_until: float
    clock: Clock = field(default=time.monotonic, repr=False)
    lost_reason: str | None = None

    def extend(self, sent_at: float) -> None:
        self.trusted_until = sent_at + self.ttl - trust_margin(self.ttl)

    def mark_lost(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason

    @property
    def held(self) -> bool:
        return self.lost_reason is None and self.clock() < self.trusted_until

    def check(self) -> None:
        """Raise :class:`LeaseLostError` unless the term is still trusted."""
        if self.lost_reason is None and self.clock() >= self.trusted_until:
            self.mark_lost("local trust deadline passed before a renewal succeeded")
        if self.lost_reason is not None:
            raise LeaseLostError(
                f"lease of shard {self.shard} lost: {self.lost_reason}",
                shard=self.shard,
                token=self.token,
            )

    def sql_params(self) -> dict[str, object]:
        return {"group": self.group, "shard": self.shard, "token": self.token}


def why_check_failed(term: LeaseTerm, row: tuple[Any, ...] | None) -> str:
    """Explain a failed token check from the lease row (token, holder, expires_at, now).

    The expired case names the clock gap on purpose: this process still trusting its term while
    the database calls it expired means the database's wall clock moved faster than our
    monotonic clock (a paused or restored VM, a clock step on the database host).
    """
    if row is None:
        return "the lease row is gone"
    token, holder, expires_at, now = row
    if int(token) != term.token:
        return f"taken over (token {token} now, held by {holder})"
    if holder is None:
        return "released"
    if expires_at <= now:
        ago = (now - expires_at).total_seconds()
        trusted = term.trusted_until - term.clock()
        if trusted > 0:
            return (
                f"expired by the database clock {ago:.1f}s ago while this process still trusted"
                f" it for {trusted:.1f}s (the database's clock jumped ahead of ours: a paused or"
                " restored VM, or a clock step)"
            )
        return f"expired by the database clock {ago:.1f}s ago (renewals did not succeed)"
    return "the token check failed, but the lease row is ours and unexpired now"


class LeaseStore:
    """The lease SQL, on an autocommit connection of its own.

    ``now`` (tests only) replaces the database clock in the expiry checks, so a test can act
    "later" instead of sleeping through a TTL; production passes None.
    """

    def __init__(self, schema: str, *, clock: Clock = time.monotonic) -> None:
        self._schema = schema
        self._clock = clock

    async def acquire(
        self,
        conn: psycopg.AsyncConnection[Any],
        group: str,
        shard: int,
        holder: str,
        ttl: float,
        *,
        now: datetime | None = None,
    ) -> LeaseTerm | None:
        sent_at = self._clock()
        row = await db.one_async(
            conn,
            db.query("relay", "lease_acquire", self._schema),
            {"group": group, "shard": shard, "holder": holder, "ttl": ttl, "now": now},
        )
        if row is None:
            return None
        term = LeaseTerm(group, shard, holder, int(row[0]), ttl, 0.0, self._clock)
        term.extend(sent_at)
        logger.info(
            "acquired lease of shard %s (token %s)",
            shard,
            term.token,
            extra={"shard": shard, "token": term.token},
        )
        return term

    async def renew(
        self, conn: psycopg.AsyncConnection[Any], term: LeaseTerm, *, now: datetime | None = None
    ) -> bool:
        """Renew one term (False: lost, and marked so)."""
        return not await self.renew_many(conn, [term], now=now)

    async def renew_many(
        self,
        conn: psycopg.AsyncConnection[Any],
        terms: list[LeaseTerm],
        *,
        now: datetime | None = None,
    ) -> list[LeaseTerm]:
        """Renew terms of one (group, holder, ttl) in one statement; return (and mark) the lost."""
        if not terms:
            return []
        first = terms[0]
        sent_at = self._clock()
        rows = await db.rows_async(
            conn,
            db.query("relay", "lease_renew_many", self._schema),
            {
                "group": first.group,
                "holder": first.holder,
                "ttl": first.ttl,
                "shards": [t.shard for t in terms],
                "tokens": [t.token for t in terms],
                "now": now,
            },
        )
        renewed = {int(row[0]) for row in rows}
        lost = []
        for term in terms:
            if term.shard in renewed:
                term.extend(sent_at)
            else:
                term.mark_lost("renewal matched no lease row (expired or taken over)")
                lost.append(term)
        return lost

    async def release(self, conn: psycopg.AsyncConnection[Any], term: LeaseTerm) -> bool:
        row = await db.one_async(
            conn, db.query("relay", "lease_release", self._schema), term.sql_params()
        )
        term.mark_lost("released")
        return row is not None
