"""The one decision core for a delivery: claim, run the handler, settle the outcome (sans-IO).

Per delivery (:meth:`InboxCore.deliver`, a plan of steps):

1. read the event id and content digest (no id -> ``inbox_rejection``, offset advances);
2. **claim** ``(consumer, event_id)`` in a short transaction of its own: a new row, or a
   takeover of an unfinished one with a newer lease token; a finished one is a duplicate
   (``duplicate_count + 1``); the same id with other content is recorded in ``inbox_rejection``
   and the original row is left untouched;
3. run the handler in **its own transaction** with the typed event, a :class:`HandlerContext`
   and that transaction's session; the same transaction ends with
   ``UPDATE .. SET state='succeeded' WHERE state='processing' AND lease_token=:token``. If that
   matches nothing (cancelled meanwhile, or fenced by a newer claim) everything the handler wrote
   is rolled back;
4. the consumer loop commits the Kafka offset only after that commit.

The claim commits first so the handler's transaction does not hold the inbox row's lock while it
runs: an operator's cancel is one quick UPDATE that never waits for the handler.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from outboxkit.bounds import check_range, keep
from outboxkit.db.availability import interrupted
from outboxkit.errors import DecodeError, LeaseLostError, SendStoppedError
from outboxkit.faults import fault_point
from outboxkit.inbox.batch_claims import Interruptions, OwedClaims
from outboxkit.inbox.context import HandlerContext
from outboxkit.inbox.envelope import Envelope, EventIdFrom, Identity, identify
from outboxkit.inbox.frozen import build
from outboxkit.inbox.give_up import give_up
from outboxkit.inbox.guard import InvalidHeaderError, bounded, error_text, message
from outboxkit.inbox.lease import LeaseHandle
from outboxkit.inbox.outcome import Outcome, OutcomeKind, Recorded
from outboxkit.inbox.policy import RetryPolicy
from outboxkit.inbox.registry import EventRegistry
from outboxkit.inbox.steps import (
    CallHandler,
    CloseHandler,
    CommitHandler,
    EndDelivery,
    Plan,
    Publish,
    StartLease,
    Step,
)
from outboxkit.inbox.stopped import held_for_next_start
from outboxkit.inbox.store import Claim, InboxStatements
from outboxkit.schema import DEFAULT_SCHEMA, InboxState, check_consumer_name, check_owner
from outboxkit.settings.models import CENTURY, DAY

logger = logging.getLogger("outboxkit.inbox.middleware")

Revoked = Callable[[], bool]
# Builds the step that publishes a dead letter (or None: no dead-letter topic).
DeadLetterStep = Callable[[Envelope, str, str, int], Step | None]

# A lost lease is retried from the same offset if the partition is still ours (a failed renewal
# when the database blipped); a short pause keeps that from spinning.
LEASE_LOST_RETRY_SECONDS = 1.0
REFUSED_BY_TOKEN = "final succeeded update refused by token"


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _never() -> bool:
    return False


def _no_dead_letter(env: Envelope, event_id: str, error: str, attempts: int) -> None:
    return None


@dataclass(frozen=True)
class InboxSettings:
    """Configuration shared by both drivers.

    ``consumer``: the name leading every inbox row's key; not empty, at most 255 UTF-8 bytes
    (``outboxkit.schema.MAX_NAME_BYTES``), no NUL (else a
    :class:`~outboxkit.errors.ConfigurationError`).

    ``replay_window`` (seconds): a delivery whose Kafka timestamp is older than this and whose
    dedup row no longer exists is refused (recorded in ``inbox_rejection``) instead of being
    applied again; set it to the retention window of the dedup rows.

    ``lease_seconds``: above 0 and at most a day; ``replay_window``: above 0 and at most a
    century (seconds).

    ``error_detail``: store and publish the full exception text (with SQL parameters and row
    values) instead of the class, SQLSTATE and first line (see :func:`guard.error_text`).
    """

    consumer: str
    registry: EventRegistry
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    schema: str = DEFAULT_SCHEMA
    lease_seconds: float = 30.0
    owner: str = field(default_factory=default_owner)
    event_id_from: EventIdFrom | None = None
    replay_window: float | None = None
    error_detail: bool = False

    def __post_init__(self) -> None:
        """A NaN lease renews in a busy loop and, like an infinite one, fails every claim in
        PostgreSQL; a replay window of 0 or less refuses every delivery without a dedup row; a
        consumer name or owner PostgreSQL cannot store fails every claim, retried forever."""
        check_consumer_name("InboxSettings.consumer", self.consumer)
        check_owner("InboxSettings.owner", self.owner)
        lease = check_range("InboxSettings.lease_seconds", self.lease_seconds, 0, DAY, above=True)
        keep(self, lease_seconds=lease)
        if self.replay_window is not None:
            window = check_range(
                "InboxSettings.replay_window", self.replay_window, 0, CENTURY, above=True
            )
            keep(self, replay_window=window)

    def too_old(self, env: Envelope, now: float | None = None) -> bool:
        if self.replay_window is None or env.timestamp_ms is None or env.timestamp_ms <= 0:
            return False
        now = time.time() if now is None else now
        return env.timestamp_ms / 1000.0 < now - self.replay_window


@dataclass(frozen=True, slots=True)
class ClaimedRun:
    """One claimed delivery: what settling it needs."""

    env: Envelope
    ident: Identity
    claim: Claim
    dead_letter: DeadLetterStep


def handler_context(
    settings: InboxSettings,
    env: Envelope,
    ident: Identity,
    claim: Claim,
    lease: LeaseHandle,
    revoked: Revoked,
) -> HandlerContext:
    def lost() -> str | None:
        reason = lease.reason()
        if reason is None and revoked():
            return "partition revoked"
        return reason

    return build(
        HandlerContext,
        consumer=settings.consumer,
        event_id=ident.event_id,
        idempotency_key=ident.idempotency_key,
        event_type=ident.event_type,
        headers=dict(env.headers),
        attempt=claim.attempts,
        topic=env.topic,
        partition=env.partition,
        offset=env.offset,
        lease_token=claim.token,
        _lost_reason=lost,
    )


class InboxCore:
    """What both inboxes decide; they differ only in how they execute the steps."""

    def __init__(
        self,
        settings: InboxSettings,
        handler: Callable[..., Any] | None,
        *,
        coroutines: bool,
    ) -> None:
        settings.registry.check_handlers(coroutines=coroutines, fallback=handler)
        self.settings = settings
        self.handler = handler
        self.statements = InboxStatements(
            settings.consumer,
            owner=settings.owner,
            schema=settings.schema,
            lease_seconds=settings.lease_seconds,
        )
        self.owed = OwedClaims(self.statements)  # give-backs that failed: made before a claim
        self.interruptions = Interruptions()  # runs the database interrupted, in a row

    def deliver(
        self,
        env: Envelope,
        revoked: Revoked = _never,
        dead_letter: DeadLetterStep = _no_dead_letter,
    ) -> Plan[Outcome]:
        """Process one delivery to its :class:`Outcome`; ends by releasing lease and session."""
        try:
            outcome = yield from self._deliver(env, revoked, dead_letter)
        except Exception:
            yield EndDelivery()
            raise
        yield EndDelivery()
        return outcome

    def _deliver(
        self, env: Envelope, revoked: Revoked, dead_letter: DeadLetterStep
    ) -> Plan[Outcome]:
        statements = self.statements
        ident = yield from self.admit(env)
        if isinstance(ident, Outcome):
            return ident
        if self.owed.claims:
            yield from self.owed.repay([ident.event_id])
        try:
            claim = yield from statements.claim_plan(ident, env)
        except Exception:
            self.interruptions.outage()  # no record's fault: interrupted runs start over
            raise
        if claim.kind != "claimed":
            return (yield from self.not_claimed(env, ident, claim))
        return (yield from self.run_claimed(ClaimedRun(env, ident, claim, dead_letter), revoked))

    def run_claimed(self, run: ClaimedRun, revoked: Revoked) -> Plan[Outcome]:
        """The handler of one claimed delivery in a transaction of its own, to its outcome."""
        settings, statements = self.settings, self.statements
        ident, claim = run.ident, run.claim
        if claim.attempts > settings.policy.max_attempts:
            return (
                yield from self._dead(
                    run, f"attempts exhausted; last error: {claim.previous_error}", own=False
                )
            )
        try:
            event = settings.registry.decode(ident.event_type, ident.content_type, run.env.value)
        except DecodeError as exc:
            return (yield from self.refuse(run, str(exc)))
        handler = settings.registry.handler_for(ident.event_type) or self.handler
        if handler is None:
            return (yield from self.refuse(run, f"no handler for {ident.event_type!r}"))
        lease = yield StartLease(ident.event_id, claim.token)
        ctx = handler_context(settings, run.env, ident, claim, lease, revoked)
        committed, failure, ours = False, None, False
        try:
            yield CallHandler(handler, event, ctx)
            ctx.check()
            ours = True  # the mark is the middleware's own statement (the handler flushed)
            marked = yield statements.succeeded(ident.event_id, claim.token)
            ours = False  # the commit runs what the handler deferred too (its triggers)
            if marked.rowcount == 1:
                fault_point("before_db_commit")
                yield CommitHandler()
                committed = True
        except Exception as exc:
            failure = exc
        if not committed:
            yield CloseHandler()
        if failure is not None and interrupted(failure, own_statement=ours):
            free, times = self.interruptions.free(ident.event_id)
            if free:
                yield from self.give_back(run)
                raise failure  # the loop retries it, as the database's state, never counted
            text = error_text(failure, detail=self.settings.error_detail)
            return (yield from self.failed_with(run, f"run interrupted {times} times: {text}"))
        self.interruptions.ended(ident.event_id)
        if isinstance(failure, LeaseLostError):
            return (yield from self.lease_lost(run, message(failure)))
        if failure is not None:
            return (yield from self.failed(run, failure))
        if not committed:
            return (yield from self.lease_lost(run, REFUSED_BY_TOKEN))
        fault_point("after_db_commit")
        return Outcome(OutcomeKind.SUCCEEDED, ident.event_id, claim.attempts)

    def give_back(self, run: ClaimedRun) -> Plan[None]:
        """A run the database interrupted is no attempt (as in a batch: ``.batch_claims``):
        its claim is given back; if that fails too, before the event is claimed again."""
        key = (run.ident.event_id, run.claim.token)
        try:
            yield self.statements.release_batch([key])
        except Exception as exc:
            logger.warning("claim of %s not given back yet: %s", key[0], error_text(exc))
            self.owed.owe([key])

    def failed(self, run: ClaimedRun, failure: Exception) -> Plan[Outcome]:
        """A handler failure (its writes rolled back): retry, or dead when exhausted."""
        return (
            yield from self.failed_with(run, error_text(failure, detail=self.settings.error_detail))
        )

    def not_claimed(self, env: Envelope, ident: Identity, claim: Claim) -> Plan[Outcome]:
        """A duplicate of a finished event (skipped; its recorded outcome is acknowledged again),
        or its id reused (rejection log)."""
        if claim.kind == "duplicate":
            state, attempts, error = claim.existing_state, claim.attempts, claim.previous_error
            recorded = None if state is None else Recorded(state, attempts, error)
            return Outcome(OutcomeKind.DUPLICATE, ident.event_id, recorded=recorded)
        reason = f"event id reused with different content (existing: {claim.existing_state})"
        yield self.statements.reject(env, reason, ident)
        return Outcome(OutcomeKind.REJECTED, ident.event_id, error=reason, rejection_log=True)

    def admit(self, env: Envelope) -> Plan[Identity | Outcome]:
        """The delivery's identity, or its ``rejected`` outcome (no usable event id, or a replay
        older than the dedup window of a forgotten event), recorded in the rejection log."""
        return (yield from self.admitted(env, self.identify(env)))

    def identify(self, env: Envelope) -> Identity | DecodeError:
        """The delivery's identity, or why it has none: no IO, so a batch admits a record whose
        identity is plain without a plan of its own (see :meth:`admitted`)."""
        try:
            return identify(env, self.settings.event_id_from)
        except DecodeError as exc:
            return exc

    def admitted(self, env: Envelope, ident: Identity | DecodeError) -> Plan[Identity | Outcome]:
        """:meth:`admit` once :meth:`identify` answered: a refusal is recorded; an identity is
        returned unless it is a replay too old (``replay_window``) of an event forgotten."""
        settings, statements = self.settings, self.statements
        if isinstance(ident, DecodeError):
            exc = ident
            event_id = exc.safe_event_id if isinstance(exc, InvalidHeaderError) else None
            reason = bounded(str(exc))
            yield statements.reject(env, reason, event_id=event_id)
            return Outcome(OutcomeKind.REJECTED, event_id, error=reason, rejection_log=True)
        if settings.too_old(env) and not (yield statements.state(ident.event_id)).rows:
            reason = "replay older than the dedup retention window; refused"
            yield statements.reject(env, reason, ident)
            return Outcome(OutcomeKind.REJECTED, ident.event_id, error=reason, rejection_log=True)
        return ident

    def refuse(self, run: ClaimedRun, reason: str) -> Plan[Outcome]:
        """Undecodable or unhandled after the claim: the row ends ``rejected``."""
        event_id, claim, reason = run.ident.event_id, run.claim, bounded(reason)
        finish = self.statements.finish(event_id, claim.token, InboxState.REJECTED, reason)
        if (yield finish).rowcount != 1:
            return (yield from self.lease_lost(run, f"rejection refused: {reason}"))
        return Outcome(OutcomeKind.REJECTED, event_id, claim.attempts, reason)

    def failed_with(self, run: ClaimedRun, error: str) -> Plan[Outcome]:
        event_id, claim = run.ident.event_id, run.claim
        logger.info("handler for %s failed (attempt %d): %s", event_id, claim.attempts, error)
        policy = self.settings.policy
        if policy.exhausted(claim.attempts):
            return (yield from self._dead(run, error))
        recorded = yield self.statements.record_failure(event_id, claim.token, error)
        if recorded.rowcount != 1:
            return (yield from self.lease_lost(run, f"failure not recorded: {error}"))
        delay = policy.delay(claim.attempts)
        return Outcome(OutcomeKind.RETRY, event_id, claim.attempts, error, delay)

    def _dead(self, run: ClaimedRun, error: str, own: bool = True) -> Plan[Outcome]:
        # Dead-letter record first, then the row: a crash in between repeats the record
        # (at-least-once, carrying the event id) rather than losing it. An event cancelled or
        # taken over before the renewal (by token) gets no dead letter; a cancel during the
        # publish leaves both, the row cancelled (documented: check the row before a replay).
        event_id, claim = run.ident.event_id, run.claim
        if (yield self.statements.renew(event_id, claim.token)).rowcount != 1:
            return (yield from self.lease_lost(run, f"not dead-lettered: {error}"))
        publish = run.dead_letter(run.env, event_id, error, claim.attempts)
        alert = None
        if publish is not None:
            try:
                yield publish
            except SendStoppedError as exc:  # the consumer stops: held for its next start
                return (yield from held_for_next_start(self, run, error, own, exc))
            except Exception as exc:
                # Retrying would hold the partition forever (missing topic, no ACL, too
                # large): the event ends dead, and says why it has no dead-letter record.
                where = f" to {publish.topic!r}" if isinstance(publish, Publish) else ""
                failure = error_text(exc, detail=self.settings.error_detail)
                error = bounded(f"dead letter could not be published{where}: {failure}; {error}")
                logger.error("event %s: %s", event_id, error)
                alert = "dead_letter_failed"
        finish = self.statements.finish(event_id, claim.token, InboxState.DEAD, error)
        if (yield finish).rowcount != 1:
            return (yield from self.lease_lost(run, f"dead mark refused: {error}"))
        logger.warning("event %s is dead after %d attempts", event_id, claim.attempts)
        return Outcome(OutcomeKind.DEAD, event_id, claim.attempts, error, alert=alert)

    def give_up(self, env: Envelope, error: str, failures: int) -> Plan[Outcome]:
        """End a delivery that failed ``failures`` times outside the handler
        (:func:`~outboxkit.inbox.give_up.give_up`)."""
        return (yield from give_up(self, env, error, failures))

    def lease_lost(self, run: ClaimedRun, reason: str) -> Plan[Outcome]:
        """Count the lost lease; a cancelled row makes the outcome ``cancelled``."""
        event_id, attempts = run.ident.event_id, run.claim.attempts
        yield self.statements.record_lease_lost(event_id, f"lease lost: {reason}")
        row = (yield self.statements.state(event_id)).rows
        if row and row[0][0] == InboxState.CANCELLED:
            return Outcome(OutcomeKind.CANCELLED, event_id, attempts, reason)
        logger.warning("lease on %s lost (%s); effects rolled back", event_id, reason)
        retry_in = LEASE_LOST_RETRY_SECONDS
        return Outcome(OutcomeKind.LEASE_LOST, event_id, attempts, reason, retry_in)
