"""The one design both adapters share: claim, run the handler, settle the outcome.

Per delivery:

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
4. the adapter commits the Kafka offset only after that commit.

The claim commits first so the handler's transaction does not hold the inbox row's lock while it
runs: an operator's cancel is one quick UPDATE that never waits for the handler.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event as sa_event
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from outboxkit.errors import DecodeError, HandlerCommitError, LeaseLostError
from outboxkit.inbox.context import HandlerContext
from outboxkit.inbox.envelope import Envelope, EventIdFrom, Identity, identify
from outboxkit.inbox.faults import fault_point
from outboxkit.inbox.lease import AsyncLeaseKeeper, LeaseRenewer
from outboxkit.inbox.outcome import Outcome, OutcomeKind
from outboxkit.inbox.policy import RetryPolicy
from outboxkit.inbox.registry import EventRegistry
from outboxkit.inbox.store import AsyncInboxStore, Claim, InboxStore
from outboxkit.migrator import DEFAULT_SCHEMA

logger = logging.getLogger("outboxkit.inbox.middleware")

SyncHandler = Callable[[Any, HandlerContext, Session], None]
AsyncHandler = Callable[[Any, HandlerContext, AsyncSession], Awaitable[None]]
DeadLetterSink = Callable[[Envelope, str, str, int], None]
AsyncDeadLetterSink = Callable[[Envelope, str, str, int], Awaitable[None]]
Revoked = Callable[[], bool]

# A lost lease is retried from the same offset if the partition is still ours (a failed renewal
# when the database blipped); a short pause keeps that from spinning.
_LEASE_LOST_RETRY_SECONDS = 1.0


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class InboxSettings:
    """Configuration shared by both adapters.

    ``replay_window`` (seconds): a delivery whose Kafka timestamp is older than this and whose
    dedup row no longer exists is refused (recorded in ``inbox_rejection``) instead of being
    applied again; set it to the retention window of the dedup rows.
    """

    consumer: str
    registry: EventRegistry
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    schema: str = DEFAULT_SCHEMA
    lease_seconds: float = 30.0
    owner: str = field(default_factory=default_owner)
    event_id_from: EventIdFrom | None = None
    replay_window: float | None = None

    def too_old(self, env: Envelope, now: float | None = None) -> bool:
        if self.replay_window is None or env.timestamp_ms is None or env.timestamp_ms <= 0:
            return False
        now = time.time() if now is None else now
        return env.timestamp_ms / 1000.0 < now - self.replay_window


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:4000]


def _context(
    settings: InboxSettings,
    env: Envelope,
    ident: Identity,
    claim: Claim,
    lost: Callable[[], str | None],
) -> HandlerContext:
    return HandlerContext(
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


def _lost_reason(keeper_reason: str | None, revoked: Revoked) -> str | None:
    if keeper_reason is not None:
        return keeper_reason
    return "partition revoked" if revoked() else None


def _never() -> bool:
    return False


class _CommitGuard:
    """Refuses a commit issued by the handler itself.

    The handler's writes must commit together with the ``succeeded`` mark; a commit inside the
    handler would make them durable before the token check and break exactly-once.
    """

    def __init__(self, session: Session) -> None:
        self.allowed = False
        sa_event.listen(session, "before_commit", self._check)

    def _check(self, session: Session) -> None:
        if not self.allowed:
            raise HandlerCommitError()


class Inbox:
    """Sync middleware (confluent-kafka adapter): handlers get a SQLAlchemy ``Session``."""

    def __init__(self, engine: Engine, handler: SyncHandler, settings: InboxSettings) -> None:
        self.engine = engine
        self.handler = handler
        self.settings = settings
        self.store = InboxStore(
            engine,
            settings.consumer,
            owner=settings.owner,
            schema=settings.schema,
            lease_seconds=settings.lease_seconds,
        )
        self._renewer = LeaseRenewer(self.store)

    def close(self) -> None:
        """Stop the lease renewal thread (the adapter calls this on close)."""
        self._renewer.close()

    def process(
        self,
        env: Envelope,
        *,
        revoked: Revoked = _never,
        dead_letter: DeadLetterSink | None = None,
    ) -> Outcome:
        try:
            ident = identify(env, self.settings.event_id_from)
        except DecodeError as exc:
            self.store.reject(env, str(exc))
            return Outcome(OutcomeKind.REJECTED, None, error=str(exc))
        if self.settings.too_old(env) and self.store.state_of(ident.event_id) is None:
            reason = "replay older than the dedup retention window; refused"
            self.store.reject(env, reason, ident)
            return Outcome(OutcomeKind.REJECTED, ident.event_id, error=reason)
        claim = self.store.claim(ident, env)
        if claim.kind == "duplicate":
            return Outcome(OutcomeKind.DUPLICATE, ident.event_id)
        if claim.kind == "conflict":
            reason = f"event id reused with different content (existing: {claim.existing_state})"
            self.store.reject(env, reason, ident)
            return Outcome(OutcomeKind.REJECTED, ident.event_id, error=reason)
        if claim.attempts > self.settings.policy.max_attempts:
            error = f"attempts exhausted; last error: {claim.previous_error}"
            return self._dead(env, ident, claim, error, dead_letter)
        try:
            event = self.settings.registry.decode(ident.event_type, ident.content_type, env.value)
        except DecodeError as exc:
            if not self.store.finish(ident.event_id, claim.token, "rejected", str(exc)):
                return self._lease_lost(ident, claim, f"rejection refused: {exc}")
            return Outcome(OutcomeKind.REJECTED, ident.event_id, claim.attempts, str(exc))
        with self._renewer.keep(ident.event_id, claim.token) as lease_lost:

            def lost() -> str | None:
                return _lost_reason(lease_lost.reason(), revoked)

            ctx = _context(self.settings, env, ident, claim, lost)
            try:
                committed = self._run_handler(event, ctx)
            except LeaseLostError as exc:
                return self._lease_lost(ident, claim, str(exc))
            except Exception as exc:
                return self._failed(env, ident, claim, _error_text(exc), dead_letter)
        if not committed:
            return self._lease_lost(ident, claim, "final succeeded update refused by token")
        fault_point("after_db_commit")
        return Outcome(OutcomeKind.SUCCEEDED, ident.event_id, claim.attempts)

    def _run_handler(self, event: Any, ctx: HandlerContext) -> bool:
        with Session(self.engine) as session:
            guard = _CommitGuard(session)
            try:
                self.handler(event, ctx, session)
                ctx.check()
                stmt = self.store.succeeded_statement(ctx.event_id, ctx.lease_token)
                if session.connection().execute(*stmt).rowcount != 1:
                    session.rollback()
                    return False
                fault_point("before_db_commit")
                guard.allowed = True
                session.commit()
                return True
            except BaseException:
                session.rollback()
                raise

    def _failed(
        self,
        env: Envelope,
        ident: Identity,
        claim: Claim,
        error: str,
        dead_letter: DeadLetterSink | None,
    ) -> Outcome:
        logger.info("handler for %s failed (attempt %d): %s", ident.event_id, claim.attempts, error)
        if self.settings.policy.exhausted(claim.attempts):
            return self._dead(env, ident, claim, error, dead_letter)
        if not self.store.record_failure(ident.event_id, claim.token, error):
            return self._lease_lost(ident, claim, f"failure not recorded: {error}")
        delay = self.settings.policy.delay(claim.attempts)
        return Outcome(OutcomeKind.RETRY, ident.event_id, claim.attempts, error, delay)

    def _dead(
        self,
        env: Envelope,
        ident: Identity,
        claim: Claim,
        error: str,
        dead_letter: DeadLetterSink | None,
    ) -> Outcome:
        # Dead-letter record first, then the row: a crash in between repeats the record
        # (at-least-once, carrying the event id) rather than losing it. A cancelled or
        # taken-over event gets no dead letter (checked by renewing the lease by token).
        if not self.store.renew(ident.event_id, claim.token):
            return self._lease_lost(ident, claim, f"not dead-lettered: {error}")
        if dead_letter is not None:
            dead_letter(env, ident.event_id, error, claim.attempts)
        if not self.store.finish(ident.event_id, claim.token, "dead", error):
            return self._lease_lost(ident, claim, f"dead mark refused: {error}")
        logger.warning("event %s is dead after %d attempts", ident.event_id, claim.attempts)
        return Outcome(OutcomeKind.DEAD, ident.event_id, claim.attempts, error)

    def _lease_lost(self, ident: Identity, claim: Claim, reason: str) -> Outcome:
        state = self.store.record_lease_lost(ident.event_id, f"lease lost: {reason}")
        return _lease_outcome(ident, claim, reason, state)


def _lease_outcome(ident: Identity, claim: Claim, reason: str, state: str | None) -> Outcome:
    if state == "cancelled":
        return Outcome(OutcomeKind.CANCELLED, ident.event_id, claim.attempts, reason)
    logger.warning("lease on %s lost (%s); effects rolled back", ident.event_id, reason)
    return Outcome(
        OutcomeKind.LEASE_LOST, ident.event_id, claim.attempts, reason, _LEASE_LOST_RETRY_SECONDS
    )


class AsyncInbox:
    """Async middleware (aiokafka adapter): handlers are coroutines getting an ``AsyncSession``."""

    def __init__(self, engine: AsyncEngine, handler: AsyncHandler, settings: InboxSettings) -> None:
        self.engine = engine
        self.handler = handler
        self.settings = settings
        self.store = AsyncInboxStore(
            engine,
            settings.consumer,
            owner=settings.owner,
            schema=settings.schema,
            lease_seconds=settings.lease_seconds,
        )

    async def process(
        self,
        env: Envelope,
        *,
        revoked: Revoked = _never,
        dead_letter: AsyncDeadLetterSink | None = None,
    ) -> Outcome:
        try:
            ident = identify(env, self.settings.event_id_from)
        except DecodeError as exc:
            await self.store.reject(env, str(exc))
            return Outcome(OutcomeKind.REJECTED, None, error=str(exc))
        if self.settings.too_old(env) and await self.store.state_of(ident.event_id) is None:
            reason = "replay older than the dedup retention window; refused"
            await self.store.reject(env, reason, ident)
            return Outcome(OutcomeKind.REJECTED, ident.event_id, error=reason)
        claim = await self.store.claim(ident, env)
        if claim.kind == "duplicate":
            return Outcome(OutcomeKind.DUPLICATE, ident.event_id)
        if claim.kind == "conflict":
            reason = f"event id reused with different content (existing: {claim.existing_state})"
            await self.store.reject(env, reason, ident)
            return Outcome(OutcomeKind.REJECTED, ident.event_id, error=reason)
        if claim.attempts > self.settings.policy.max_attempts:
            error = f"attempts exhausted; last error: {claim.previous_error}"
            return await self._dead(env, ident, claim, error, dead_letter)
        try:
            event = self.settings.registry.decode(ident.event_type, ident.content_type, env.value)
        except DecodeError as exc:
            if not await self.store.finish(ident.event_id, claim.token, "rejected", str(exc)):
                return await self._lease_lost(ident, claim, f"rejection refused: {exc}")
            return Outcome(OutcomeKind.REJECTED, ident.event_id, claim.attempts, str(exc))
        async with AsyncLeaseKeeper(self.store, ident.event_id, claim.token) as keeper:

            def lost() -> str | None:
                return _lost_reason(keeper.lost.reason(), revoked)

            ctx = _context(self.settings, env, ident, claim, lost)
            try:
                committed = await self._run_handler(event, ctx)
            except LeaseLostError as exc:
                return await self._lease_lost(ident, claim, str(exc))
            except Exception as exc:
                return await self._failed(env, ident, claim, _error_text(exc), dead_letter)
        if not committed:
            return await self._lease_lost(ident, claim, "final succeeded update refused by token")
        fault_point("after_db_commit")
        return Outcome(OutcomeKind.SUCCEEDED, ident.event_id, claim.attempts)

    async def _run_handler(self, event: Any, ctx: HandlerContext) -> bool:
        async with AsyncSession(self.engine) as session:
            guard = _CommitGuard(session.sync_session)
            try:
                await self.handler(event, ctx, session)
                ctx.check()
                stmt = self.store.succeeded_statement(ctx.event_id, ctx.lease_token)
                conn = await session.connection()
                if (await conn.execute(*stmt)).rowcount != 1:
                    await session.rollback()
                    return False
                fault_point("before_db_commit")
                guard.allowed = True
                await session.commit()
                return True
            except BaseException:
                await session.rollback()
                raise

    async def _failed(
        self,
        env: Envelope,
        ident: Identity,
        claim: Claim,
        error: str,
        dead_letter: AsyncDeadLetterSink | None,
    ) -> Outcome:
        logger.info("handler for %s failed (attempt %d): %s", ident.event_id, claim.attempts, error)
        if self.settings.policy.exhausted(claim.attempts):
            return await self._dead(env, ident, claim, error, dead_letter)
        if not await self.store.record_failure(ident.event_id, claim.token, error):
            return await self._lease_lost(ident, claim, f"failure not recorded: {error}")
        delay = self.settings.policy.delay(claim.attempts)
        return Outcome(OutcomeKind.RETRY, ident.event_id, claim.attempts, error, delay)

    async def _dead(
        self,
        env: Envelope,
        ident: Identity,
        claim: Claim,
        error: str,
        dead_letter: AsyncDeadLetterSink | None,
    ) -> Outcome:
        if not await self.store.renew(ident.event_id, claim.token):
            return await self._lease_lost(ident, claim, f"not dead-lettered: {error}")
        if dead_letter is not None:
            await dead_letter(env, ident.event_id, error, claim.attempts)
        if not await self.store.finish(ident.event_id, claim.token, "dead", error):
            return await self._lease_lost(ident, claim, f"dead mark refused: {error}")
        logger.warning("event %s is dead after %d attempts", ident.event_id, claim.attempts)
        return Outcome(OutcomeKind.DEAD, ident.event_id, claim.attempts, error)

    async def _lease_lost(self, ident: Identity, claim: Claim, reason: str) -> Outcome:
        state = await self.store.record_lease_lost(ident.event_id, f"lease lost: {reason}")
        return _lease_outcome(ident, claim, reason, state)
