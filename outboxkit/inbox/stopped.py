"""A dead letter the consumer's stop ended while it waited for Kafka (sans-IO).

The record is held as for a retry: its offset is not committed, and the next start delivers it
again and publishes the dead letter then. Its handler's own error is kept on the row, as the
dead letter sent then gives the row's last error (``attempts exhausted; last error: ...``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from outboxkit.inbox.outcome import Outcome, OutcomeKind
from outboxkit.inbox.steps import Plan

if TYPE_CHECKING:
    from outboxkit.inbox.delivery import ClaimedRun, InboxCore

logger = logging.getLogger("outboxkit.inbox.middleware")


def held_for_next_start(
    core: InboxCore, run: ClaimedRun, error: str, own: bool, why: Exception
) -> Plan[Outcome]:
    """``own``: ``error`` is the handler's (not the "attempts exhausted" of a takeover, whose
    row holds the handler's already). A row cancelled meanwhile makes it a lost lease."""
    event_id, claim = run.ident.event_id, run.claim
    logger.warning("event %s: %s; delivered again at the next start", event_id, why)
    if own:
        recorded = yield core.statements.record_failure(event_id, claim.token, error)
        if recorded.rowcount != 1:
            return (yield from core.lease_lost(run, f"failure not recorded: {error}"))
    delay = core.settings.policy.delay(claim.attempts)  # a consumer polled on is not spun
    return Outcome(OutcomeKind.RETRY, event_id, claim.attempts, error, delay)
