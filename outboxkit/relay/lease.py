"""One shard's lease: acquire, renew, release by SQL, judged by the database clock.

The holder trusts its lease only until a *local monotonic* deadline: the moment the renewal was
sent plus the TTL minus a safety margin. That deadline ends before the database can see the lease
expire, so by the time a standby may take over, this process has already stopped publishing —
whatever its wall clock says. Every relay write also re-checks the token in SQL (fencing).

One case the monotonic clock alone misses: a paused virtual machine. Its monotonic clock stands
still while paused and its wall clock is set forward on resume, while the database's clock ran
on. So the deadline is judged on the monotonic clock *plus* any forward jump of the wall clock
since the renewal was sent: once a resumed VM's wall clock is stepped forward (a guest agent
or time synchronisation does it; a slewed correction is not seen), the relay stops at its next
step instead of finding out at its next write's token check.
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
from outboxkit.relay.lease_loss import LeaseLoss, blame_jump, explain_losses, unreadable

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
    lost_cause: LeaseLoss | None = None
    wall: Clock = field(default=time.time, repr=False)
    previous: int | None = None  # the shard's token before this term's (None: unknown, or none)
    _offset: float = field(default=0.0, init=False, repr=False)  # wall - monotonic at the send

    def __post_init__(self) -> None:
        self._offset = self.wall() - self.clock()

    def extend(self, sent_at: float, sent_wall: float) -> None:
        """Trust until ``sent_at`` + TTL - margin; ``sent_wall`` is the wall clock read at the
        same moment (both before the statement went out: a pause during it must count)."""
        self.trusted_until = sent_at + self.ttl - trust_margin(self.ttl)
        self._offset = sent_wall - sent_at

    def mark_lost(self, reason: str, cause: LeaseLoss) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
            self.lost_cause = cause

    def jumped(self) -> float:
        """Seconds the wall clock moved ahead of the monotonic one since the last renewal was
        sent (a paused VM's pause; NTP's slewing adds milliseconds at most). Never negative."""
        return max(0.0, self.wall() - self.clock() - self._offset)

    def trusted_for(self) -> float:
        """Seconds of trust left by the monotonic clock alone (the wall clock's jump not
        counted)."""
        return self.trusted_until - self.clock()

    def remaining(self) -> float:
        """Seconds this term is still trusted (negative: past its deadline)."""
        return self.trusted_for() - self.jumped()

    @property
    def held(self) -> bool:
        return self.lost_reason is None and self.remaining() > 0

    def check(self) -> None:
        """Raise :class:`LeaseLostError` unless the term is still trusted."""
        if self.lost_reason is None and self.remaining() <= 0:
            cause, why = blame_jump(
                self,
                LeaseLoss.TRUST_LAPSED,
                "local trust deadline passed before a renewal succeeded",
            )
            self.mark_lost(why, cause)
        if self.lost_reason is not None:
            raise LeaseLostError(
                f"lease of shard {self.shard} lost: {self.lost_reason}",
                shard=self.shard,
                token=self.token,
                cause=self.lost_cause or LeaseLoss.UNKNOWN,
            )

    def sql_params(self, now: datetime | None = None) -> dict[str, object]:
        """The term's parameters for the fencing check (relay.sql's ``_lease_held``) and the
        release; ``now`` (tests only) replaces the database clock in the check's expiry test."""
        return {"group": self.group, "shard": self.shard, "token": self.token, "now": now}


class LeaseStore:
    """The lease SQL, on an autocommit connection of its own.

    ``now`` (tests only) replaces the database clock in the expiry checks, so a test can act
    "later" instead of sleeping through a TTL; production passes None.
    """

    def __init__(
        self, schema: str, *, clock: Clock = time.monotonic, wall: Clock = time.time
    ) -> None:
        self._schema = schema
        self._clock = clock
        self._wall = wall

    async def acquire(
        self,
        conn: psycopg.AsyncConnection[Any],
        group: str,
        shard: int,
        holder: str,
        ttl: float,
        *,
        now: datetime | None = None,
        level: int = logging.INFO,
    ) -> LeaseTerm | None:
        sent_at, sent_wall = self._clock(), self._wall()
        row = await db.one_async(
            conn,
            db.query("relay", "lease_acquire", self._schema),
            {"group": group, "shard": shard, "holder": holder, "ttl": ttl, "now": now},
        )
        if row is None:
            return None
        term = LeaseTerm(group, shard, holder, int(row[0]), ttl, 0.0, self._clock, wall=self._wall)
        term.previous = None if row[1] is None else int(row[1])
        term.extend(sent_at, sent_wall)
        logger.log(
            level,
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
        sent_at, sent_wall = self._clock(), self._wall()
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
        lost = [term for term in terms if term.shard not in renewed]
        for term in terms:
            if term.shard in renewed:
                term.extend(sent_at, sent_wall)
        if lost:
            # Every renewed term is extended first: a slow or cancelled read-back below must not
            # cost them their renewal. The lost ones are marked whatever happens to it.
            reasons = [blame_jump(term, LeaseLoss.UNKNOWN, unreadable()) for term in lost]
            try:
                reasons = await explain_losses(conn, self._schema, lost, now)
            finally:
                for term, (cause, why) in zip(lost, reasons, strict=True):
                    term.mark_lost(f"renewal matched no lease row: {why}", cause)
        return lost

    async def release(self, conn: psycopg.AsyncConnection[Any], term: LeaseTerm) -> bool:
        row = await db.one_async(
            conn, db.query("relay", "lease_release", self._schema), term.sql_params()
        )
        term.mark_lost("released", LeaseLoss.RELEASED)
        return row is not None
