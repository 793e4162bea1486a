"""Why a relay's lease term ended: the reason logged and counted (``reason`` label).

A term ends as lost on a refused renewal, a failed token check, a passed trust deadline or a
fenced producer. The first two read the lease row back to say what happened. A forward jump of
this host's wall clock since the last renewal outranks the reasons a pause leads to (taken over,
expired, lapsed, fenced): the paused host (or the stepped clock) is then the cause and they only
its consequence. It does not outrank a release or a lost commit, which no pause causes.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NoReturn

import psycopg

from outboxkit import db
from outboxkit.db.availability import with_pooler_hint
from outboxkit.errors import LeaseLostError

if TYPE_CHECKING:
    from outboxkit.relay.lease import LeaseTerm


class LeaseLoss(StrEnum):
    """The ``reason`` label of ``outboxkit_relay_lease_lost_total``: lets an alert tell a
    paused host from a slow database or a second relay."""

    TAKEN_OVER = "taken_over"  # the lease row shows a newer token
    RELEASED = "released"  # the row shows this term's token, released (by an operator)
    EXPIRED = "expired"  # expired by the database clock after this process stopped trusting it
    CLOCK_JUMP = "clock_jump"  # this host paused or its clock stepped, or the clocks disagree
    TRUST_LAPSED = "trust_lapsed"  # the local trust deadline passed before a renewal succeeded
    FENCED = "fenced"  # Kafka fenced this term's producer
    UNKNOWN = "unknown"  # the row could not be read, is gone, or shows nothing this term explains


#: A forward jump of the wall clock this large counts as a pause or a stepped clock.
JUMP_SECONDS = 1.0


def unreadable(error: Exception | None = None) -> str:
    """The reason when the lease row could not be read back (``error``: what stopped it)."""
    detail = ""
    if error is not None:
        detail = f": {type(error).__name__}: {with_pooler_hint(str(error), error)}"
    return f"expired or taken over (the lease row could not be read{detail})"


#: What a pause (or a stepped clock) leads to: after a jump these are counted as ``clock_jump``.
#: Not the others: a release or a lost commit is not something a pause causes.
PAUSE_CONSEQUENCES = frozenset(
    {LeaseLoss.TAKEN_OVER, LeaseLoss.EXPIRED, LeaseLoss.TRUST_LAPSED, LeaseLoss.FENCED}
)


def jump_note(term: LeaseTerm) -> str:
    """The clause a reason gets when the wall clock jumped since the last renewal, else ''."""
    jumped = term.jumped()
    if jumped < JUMP_SECONDS:
        return ""
    return (
        f" (the wall clock jumped {jumped:.1f}s ahead of the monotonic clock since the last"
        " renewal: this host was paused, or its clock was stepped)"
    )


def blame_jump(term: LeaseTerm, cause: LeaseLoss, why: str) -> tuple[LeaseLoss, str]:
    """``(cause, why)``, or, when the wall clock jumped since the last renewal, the jump named in
    ``why`` and blamed for the causes a pause leads to."""
    note = jump_note(term)
    if not note:
        return cause, why
    return (LeaseLoss.CLOCK_JUMP if cause in PAUSE_CONSEQUENCES else cause), why + note


def _what_the_row_shows(term: LeaseTerm, row: Sequence[Any] | None) -> tuple[LeaseLoss, str]:
    if row is None:
        return LeaseLoss.UNKNOWN, "the lease row is gone"
    token, holder, expires_at, now = row
    if int(token) < term.token:
        return LeaseLoss.UNKNOWN, (
            f"the lease row shows an older token ({token}) than this term's: the database lost"
            " commits (an asynchronous failover or a restore)"
        )
    if int(token) > term.token:
        held_by = f"held by {holder}" if holder is not None else "since released"
        return LeaseLoss.TAKEN_OVER, f"taken over (token {token} now, {held_by})"
    if holder is None:
        return LeaseLoss.RELEASED, "released"
    if holder != term.holder:
        return LeaseLoss.UNKNOWN, f"this term's token is held by {holder} (changed by hand)"
    if expires_at <= now:
        ago = (now - expires_at).total_seconds()
        trusted = term.trusted_for()
        if trusted > 0:
            # Renewals are sent before the trust window ends, so the database expiring a lease
            # this process still trusts means its clock ran faster than ours meanwhile.
            return LeaseLoss.CLOCK_JUMP, (
                f"expired by the database clock {ago:.1f}s ago while this process still trusted"
                f" it for {trusted:.1f}s (the clocks disagree: this host was paused, the"
                " database host's clock jumped or was stepped, or a database failover lost the"
                " latest renewals)"
            )
        return LeaseLoss.EXPIRED, (
            f"expired by the database clock {ago:.1f}s ago (renewals did not succeed)"
        )
    return LeaseLoss.UNKNOWN, "refused, but the lease row is ours and unexpired now"


def why_check_failed(term: LeaseTerm, row: Sequence[Any] | None) -> tuple[LeaseLoss, str]:
    """Explain a refusal from the lease row (token, holder, expires_at, now)."""
    return blame_jump(term, *_what_the_row_shows(term, row))


async def explain_losses(
    conn: psycopg.AsyncConnection[Any],
    schema: str,
    terms: Sequence[LeaseTerm],
    now: datetime | None = None,
) -> list[tuple[LeaseLoss, str]]:
    """Read the terms' lease rows back (one statement, only after a refusal) and explain each.
    ``now``: the clock the refused statement was given (tests), else the database's. All terms
    are of one relay group."""
    try:
        rows = await db.rows_async(
            conn,
            db.query("relay", "lease_state", schema),
            {"group": terms[0].group, "shards": [t.shard for t in terms], "now": now},
        )
    except (psycopg.Error, OSError) as exc:  # a reason is best effort; the loss is certain
        return [blame_jump(term, LeaseLoss.UNKNOWN, unreadable(exc)) for term in terms]
    found = {int(row[0]): row[1:] for row in rows}
    return [why_check_failed(term, found.get(term.shard)) for term in terms]


async def token_check_failed(
    conn: psycopg.AsyncConnection[Any],
    schema: str,
    term: LeaseTerm,
    during: str,
    *,
    now: datetime | None = None,
) -> NoReturn:
    """A fenced write found the lease not held: mark the term lost with the reason the lease row
    shows (read on the same connection, which the failed check left usable) and raise. ``now``:
    the clock the refused write was given (tests), else the database's."""
    ((cause, why),) = await explain_losses(conn, schema, [term], now)
    term.mark_lost(f"{during}: the token check failed: {why}", cause)
    raise LeaseLostError(
        f"lease of shard {term.shard} lost during {during}: {why}",
        shard=term.shard,
        token=term.token,
        cause=term.lost_cause,
    )
