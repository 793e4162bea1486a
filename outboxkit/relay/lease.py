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
from enum import StrEnum
from typing import Any, NoReturn

import psycopg

from outboxkit import db
from outboxkit.errors import LeaseLostError

logger = logging.getLogger("outboxkit.relay.lease")

Clock = Callable[[], float]


class LeaseLoss(StrEnum):
    """Why a term ended in lease lost: the ``reason`` label of
    ``outboxkit_relay_lease_lost_total``, so a clock problem can be told from contention or a
    second relay in an alert."""

    TAKEN_OVER = "taken_over"  # the lease row shows a newer token
    RELEASED = "released"  # the row shows this term's token, released (by an operator)
    EXPIRED = "expired"  # expired by the database clock; renewals had not succeeded
    CLOCK_JUMP = "clock_jump"  # a paused host, or a clock stepped: the clocks disagree
    TRUST_LAPSED = "trust_lapsed"  # the local trust deadline passed before a renewal succeeded
    FENCED = "fenced"  # Kafka fenced this term's producer
    UNKNOWN = "unknown"  # the lease row could not be read, or shows nothing wrong


#: A forward jump of the wall clock this large counts as a pause or a stepped clock.
JUMP_SECONDS = 1.0


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

    def remaining(self) -> float:
        """Seconds this term is still trusted (negative: past its deadline)."""
        return self.trusted_until - self.clock() - self.jumped()

    @property
    def held(self) -> bool:
        return self.lost_reason is None and self.remaining() > 0

    def check(self) -> None:
        """Raise :class:`LeaseLostError` unless the term is still trusted."""
        if self.lost_reason is None and self.remaining() <= 0:
            jumped = self.jumped()
            if jumped >= JUMP_SECONDS:
                self.mark_lost(
                    "local trust deadline passed before a renewal succeeded (the wall clock"
                    f" jumped {jumped:.1f}s ahead of the monotonic clock: this host was paused,"
                    " or its clock was stepped)",
                    LeaseLoss.CLOCK_JUMP,
                )
            else:
                self.mark_lost(
                    "local trust deadline passed before a renewal succeeded",
                    LeaseLoss.TRUST_LAPSED,
                )
        if self.lost_reason is not None:
            raise LeaseLostError(
                f"lease of shard {self.shard} lost: {self.lost_reason}",
                shard=self.shard,
                token=self.token,
                cause=self.lost_cause or LeaseLoss.UNKNOWN,
            )

    def sql_params(self) -> dict[str, object]:
        return {"group": self.group, "shard": self.shard, "token": self.token}


def why_check_failed(term: LeaseTerm, row: tuple[Any, ...] | None) -> tuple[LeaseLoss, str]:
    """Explain a failed token check from the lease row (token, holder, expires_at, now).

    The expired case names the clock gap on purpose: this process still trusting its term while
    the database calls it expired means the database's clock moved faster than ours (this host
    paused without its wall clock stepped yet, or the database host's clock stepped).
    """
    if row is None:
        return LeaseLoss.UNKNOWN, "the lease row is gone"
    token, holder, expires_at, now = row
    if int(token) != term.token:
        held_by = f"held by {holder}" if holder is not None else "since released"
        return LeaseLoss.TAKEN_OVER, f"taken over (token {token} now, {held_by})"
    if holder is None:
        return LeaseLoss.RELEASED, "released"
    if expires_at <= now:
        ago = (now - expires_at).total_seconds()
        trusted = term.remaining()
        if trusted > 0:
            return LeaseLoss.CLOCK_JUMP, (
                f"expired by the database clock {ago:.1f}s ago while this process still trusted"
                f" it for {trusted:.1f}s (the clocks disagree: this host was paused, or the"
                " database host's clock jumped or was stepped)"
            )
        return LeaseLoss.EXPIRED, (
            f"expired by the database clock {ago:.1f}s ago (renewals did not succeed)"
        )
    return LeaseLoss.UNKNOWN, "the token check failed, but the lease row is ours and unexpired now"


async def explain_loss(
    conn: psycopg.AsyncConnection[Any],
    schema: str,
    term: LeaseTerm,
    now: datetime | None = None,
) -> tuple[LeaseLoss, str]:
    """Read the lease row back (only after a refusal) and say why the term is lost; ``now``: the
    clock the refused statement was given (tests), else the database's."""
    try:
        row = await db.one_async(
            conn,
            db.query("relay", "lease_state", schema),
            {"group": term.group, "shard": term.shard, "now": now},
        )
    except psycopg.Error:
        return LeaseLoss.UNKNOWN, "expired or taken over (the lease row could not be read)"
    return why_check_failed(term, row)


async def token_check_failed(
    conn: psycopg.AsyncConnection[Any], schema: str, term: LeaseTerm, during: str
) -> NoReturn:
    """A fenced write found the lease not held: mark the term lost with the reason the lease row
    shows (best effort: read on the same connection, which the failed check left usable)."""
    cause, why = await explain_loss(conn, schema, term)
    term.mark_lost(f"{during}: the token check failed: {why}", cause)
    raise LeaseLostError(
        f"lease of shard {term.shard} lost during {during}: {why}", shard=term.shard, cause=cause
    )


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
        term.extend(sent_at, sent_wall)
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
        lost = []
        for term in terms:
            if term.shard in renewed:
                term.extend(sent_at, sent_wall)
            else:
                cause, why = await explain_loss(conn, self._schema, term, now)
                term.mark_lost(f"renewal matched no lease row: {why}", cause)
                lost.append(term)
        return lost

    async def release(self, conn: psycopg.AsyncConnection[Any], term: LeaseTerm) -> bool:
        row = await db.one_async(
            conn, db.query("relay", "lease_release", self._schema), term.sql_params()
        )
        term.mark_lost("released", LeaseLoss.RELEASED)
        return row is not None
