"""Giving a delivery up after repeated errors outside its handler (sans-IO)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from outboxkit.db.availability import not_the_records
from outboxkit.inbox.envelope import Envelope, Identity, identify
from outboxkit.inbox.guard import bounded, error_text
from outboxkit.inbox.outcome import Outcome, OutcomeKind
from outboxkit.inbox.steps import Plan

if TYPE_CHECKING:
    from outboxkit.inbox.delivery import InboxCore

logger = logging.getLogger("outboxkit.inbox.middleware")


def give_up(core: InboxCore, env: Envelope, error: str, failures: int) -> Plan[Outcome]:
    """End a delivery that failed ``failures`` times outside the handler (a bug, a value the
    database refuses): recorded as a rejection, and its row (if any) marked ``dead``
    (``row_dead``: then the event is dead, not only this delivery refused)."""
    statements = core.statements
    reason = bounded(f"gave up after {failures} unexpected errors: {error}")
    try:
        ident: Identity | None = identify(env, core.settings.event_id_from)
    except Exception:  # giving up must not fail for the reason it is giving up for
        ident = None
    event_id = ident.event_id if ident is not None else None
    try:
        yield statements.reject(env, reason, ident)
    except Exception as exc:
        if not_the_records(exc):
            raise  # not the values' fault: the loop retries, and records them in full
        step, event_id = statements.reject_plainly(env, reason, ident)
        ident = None
        yield step
    row_dead, attempts = False, 0
    if ident is not None:
        try:
            dead = (yield statements.abandon(ident.event_id, reason)).rows
            if dead:  # the row's attempts: its acknowledgement says "dead" (see acks.py)
                row_dead, attempts = True, int(dead[0][0])
        except Exception as exc:  # recorded as a rejection already: do not hold the record
            logger.error("marking %s dead failed: %s", ident.event_id, error_text(exc))
    logger.error("%s/%d/%d: %s", env.topic, env.partition, env.offset, reason)
    return Outcome(
        OutcomeKind.REJECTED,
        event_id,
        attempts,
        error=reason,
        alert="given_up",
        rejection_log=True,
        row_dead=row_dead,
    )
