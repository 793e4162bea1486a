"""The inbox row's state transitions, each a single SQL statement from ``sql/inbox.sql``.

Sync (:class:`InboxStore`, SQLAlchemy ``Engine``) and async (:class:`AsyncInboxStore`,
``AsyncEngine``) twins share the statement builders, so both adapters run the very same SQL.
Each method runs single statements in autocommit mode (one round trip each: every transition is
one statement, so no wider transaction is needed), except :meth:`succeeded_statement`, which the
middleware runs inside the handler's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import TextClause, text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from outboxkit.inbox.envelope import Envelope, Identity
from outboxkit.migrator import DEFAULT_SCHEMA
from outboxkit.queries import query

TERMINAL_STATES = frozenset({"succeeded", "dead", "rejected", "cancelled"})

Stmt = tuple[TextClause, dict[str, Any]]


@dataclass(frozen=True)
class Claim:
    """Result of claiming ``(consumer, event_id)`` for one delivery."""

    kind: Literal["claimed", "duplicate", "conflict"]
    token: int = 0
    attempts: int = 0
    previous_error: str | None = None
    existing_state: str | None = None


class _Statements:
    def __init__(self, consumer: str, owner: str, schema: str, lease_seconds: float) -> None:
        self.consumer = consumer
        self.owner = owner
        self.schema = schema
        self.lease_seconds = lease_seconds
        self._texts: dict[str, TextClause] = {}

    def _q(self, name: str) -> TextClause:
        clause = self._texts.get(name)
        if clause is None:
            clause = self._texts[name] = text(query("inbox", name, self.schema))
        return clause

    def _key(self, event_id: str) -> dict[str, Any]:
        return {"consumer": self.consumer, "event_id": event_id}

    def claim_stmt(self, ident: Identity, env: Envelope) -> Stmt:
        return self._q("claim"), {
            **self._key(ident.event_id),
            "idempotency_key": ident.idempotency_key,
            "content_digest": ident.digest,
            "event_type": ident.event_type,
            "owner": self.owner,
            "lease_seconds": self.lease_seconds,
            "topic": env.topic,
            "kafka_partition": env.partition,
            "kafka_offset": env.offset,
        }

    def rejection_stmt(
        self, env: Envelope, reason: str, ident: Identity | None, event_id: str | None = None
    ) -> Stmt:
        return self._q("record_rejection"), {
            "consumer": self.consumer,
            "event_id": ident.event_id if ident else event_id,
            "reason": reason[:2000],
            "content_digest": ident.digest if ident else None,
            "event_type": ident.event_type if ident else env.headers.get("event-type"),
            "topic": env.topic,
            "kafka_partition": env.partition,
            "kafka_offset": env.offset,
        }

    def token_stmt(self, name: str, event_id: str, token: int, **extra: Any) -> Stmt:
        return self._q(name), {**self._key(event_id), "token": token, **extra}

    def succeeded_statement(self, event_id: str, token: int) -> Stmt:
        return self.token_stmt("mark_succeeded", event_id, token)

    def state_stmt(self, event_id: str) -> Stmt:
        return self._q("get_state"), self._key(event_id)

    def renew_stmt(self, event_id: str, token: int) -> Stmt:
        return self.token_stmt("renew_lease", event_id, token, lease_seconds=self.lease_seconds)

    def classify(self, row: Any, ident: Identity) -> Claim:
        """After a claim matched nothing: duplicate of a finished event, or reused id."""
        state, digest = row[0], row[1]
        same = digest is None or bytes(digest) == ident.digest
        if state in TERMINAL_STATES and same:
            return Claim("duplicate", existing_state=state)
        return Claim("conflict", existing_state=state)


class InboxStore(_Statements):
    """Sync twin. Every method is one or two single-statement autocommit round trips."""

    def __init__(
        self,
        engine: Engine,
        consumer: str,
        *,
        owner: str,
        schema: str = DEFAULT_SCHEMA,
        lease_seconds: float = 30.0,
    ) -> None:
        super().__init__(consumer, owner, schema, lease_seconds)
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    def _run(self, stmt: Stmt) -> int:
        with self._autocommit.connect() as conn:
            return conn.execute(*stmt).rowcount

    def _first(self, stmt: Stmt) -> Any:
        with self._autocommit.connect() as conn:
            return conn.execute(*stmt).first()

    def claim(self, ident: Identity, env: Envelope) -> Claim:
        while True:
            row = self._first(self.claim_stmt(ident, env))
            if row is not None:
                return Claim("claimed", token=row[0], attempts=row[1], previous_error=row[2])
            existing = self._first(self.state_stmt(ident.event_id))
            if existing is None:  # deleted by retention between the two statements: again
                continue
            claim = self.classify(existing, ident)
            if claim.kind == "duplicate":
                self._run((self._q("count_duplicate"), self._key(ident.event_id)))
            return claim

    def reject(self, env: Envelope, reason: str, ident: Identity | None = None) -> None:
        self._run(self.rejection_stmt(env, reason, ident))

    def state_of(self, event_id: str) -> str | None:
        row = self._first(self.state_stmt(event_id))
        return None if row is None else str(row[0])

    def renew(self, event_id: str, token: int) -> bool:
        return self._run(self.renew_stmt(event_id, token)) == 1

    def record_failure(self, event_id: str, token: int, error: str) -> bool:
        return self._run(self.token_stmt("record_failure", event_id, token, error=error)) == 1

    def finish(self, event_id: str, token: int, state: str, error: str) -> bool:
        stmt = self.token_stmt("finish", event_id, token, state=state, error=error)
        return self._run(stmt) == 1

    def record_lease_lost(self, event_id: str, error: str) -> str | None:
        """Count the lost lease; returns the row's current state (e.g. ``cancelled``)."""
        self._run((self._q("record_lease_lost"), {**self._key(event_id), "error": error}))
        return self.state_of(event_id)


class AsyncInboxStore(_Statements):
    """Async twin of :class:`InboxStore`, same statements."""

    def __init__(
        self,
        engine: AsyncEngine,
        consumer: str,
        *,
        owner: str,
        schema: str = DEFAULT_SCHEMA,
        lease_seconds: float = 30.0,
    ) -> None:
        super().__init__(consumer, owner, schema, lease_seconds)
        self.engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    async def _run(self, stmt: Stmt) -> int:
        async with self._autocommit.connect() as conn:
            return (await conn.execute(*stmt)).rowcount

    async def _first(self, stmt: Stmt) -> Any:
        async with self._autocommit.connect() as conn:
            return (await conn.execute(*stmt)).first()

    async def claim(self, ident: Identity, env: Envelope) -> Claim:
        while True:
            row = await self._first(self.claim_stmt(ident, env))
            if row is not None:
                return Claim("claimed", token=row[0], attempts=row[1], previous_error=row[2])
            existing = await self._first(self.state_stmt(ident.event_id))
            if existing is None:
                continue
            claim = self.classify(existing, ident)
            if claim.kind == "duplicate":
                await self._run((self._q("count_duplicate"), self._key(ident.event_id)))
            return claim

    async def reject(self, env: Envelope, reason: str, ident: Identity | None = None) -> None:
        await self._run(self.rejection_stmt(env, reason, ident))

    async def state_of(self, event_id: str) -> str | None:
        row = await self._first(self.state_stmt(event_id))
        return None if row is None else str(row[0])

    async def renew(self, event_id: str, token: int) -> bool:
        return await self._run(self.renew_stmt(event_id, token)) == 1

    async def record_failure(self, event_id: str, token: int, error: str) -> bool:
        stmt = self.token_stmt("record_failure", event_id, token, error=error)
        return await self._run(stmt) == 1

    async def finish(self, event_id: str, token: int, state: str, error: str) -> bool:
        stmt = self.token_stmt("finish", event_id, token, state=state, error=error)
        return await self._run(stmt) == 1

    async def record_lease_lost(self, event_id: str, error: str) -> str | None:
        await self._run((self._q("record_lease_lost"), {**self._key(event_id), "error": error}))
        return await self.state_of(event_id)
