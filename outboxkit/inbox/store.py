"""The inbox row's state transitions, as steps: each one statement of ``db/sql/inbox.sql``.

Pure: these methods only build :class:`~outboxkit.inbox.steps.Sql` steps (and the small claim
plan); a driver runs them, on an autocommit connection of its own, except the ``succeeded``
mark, which runs inside the handler's transaction (:class:`HandlerSql`). So the sync and the
async paths run the very same statements.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

from outboxkit import db
from outboxkit.inbox.envelope import Envelope, Identity
from outboxkit.inbox.frozen import build
from outboxkit.inbox.guard import bounded, hashed
from outboxkit.inbox.steps import HandlerSql, Plan, Sql
from outboxkit.schema import DEFAULT_SCHEMA, TERMINAL_INBOX_STATES, InboxState

# How long a handler's session may stay quiet after its ``succeeded`` mark before the server
# ends it (a shorter idle_in_transaction_session_timeout of the session's own is kept): only
# the COMMIT is sent there, so this is reached only by a process frozen or cut off, whose row
# locks would hold up the next owner's claim (which does not wait for the lease to expire).
QUIET_AFTER_MARK_SECONDS = 10.0


@dataclass(frozen=True)
class Claim:
    """Result of claiming ``(consumer, event_id)`` for one delivery."""

    kind: Literal["claimed", "duplicate", "conflict"]
    token: int = 0
    attempts: int = 0
    previous_error: str | None = None
    existing_state: str | None = None

    @classmethod
    def claimed(cls, token: int, attempts: int, previous_error: str | None) -> Claim:
        """A claim made (built field by field for less: one per event of a batch)."""
        return build(
            cls,
            kind="claimed",
            token=token,
            attempts=attempts,
            previous_error=previous_error,
            existing_state=None,
        )


#: Why the log a held record was in is not there any more (the record gone with it).
LOG_REPLACED = "its topic deleted and created again, or the log truncated"


class InboxStatements:
    """Every statement one consumer runs on its inbox rows.

    ``now`` (tests only) replaces the database clock for lease expiry.
    """

    def __init__(
        self,
        consumer: str,
        *,
        owner: str,
        schema: str = DEFAULT_SCHEMA,
        lease_seconds: float = 30.0,
        now: dt.datetime | None = None,
    ) -> None:
        self.consumer = consumer
        self.owner = owner
        self.schema = schema
        self.lease_seconds = lease_seconds
        self.quiet_ms = int(QUIET_AFTER_MARK_SECONDS * 1000)
        self.now = now
        self._queries = db.queries("inbox", schema)

    def _sql(self, name: str, event_id: str | None, **params: Any) -> Sql:
        return Sql(self._queries[name], {"consumer": self.consumer, "event_id": event_id, **params})

    def claim(self, ident: Identity, env: Envelope) -> Sql:
        return self._sql(
            "claim",
            ident.event_id,
            idempotency_key=ident.idempotency_key,
            content_digest=ident.digest,
            event_type=ident.event_type,
            owner=self.owner,
            lease_seconds=self.lease_seconds,
            now=self.now,
            topic=env.topic,
            kafka_partition=env.partition,
            kafka_offset=env.offset,
        )

    def claim_batch(self, items: list[tuple[Identity, Envelope]]) -> Sql:
        """Claim several deliveries in one statement -> rows ``(event_id, token, attempts,
        last_error)`` of those claimed (the others are duplicates or reused ids)."""
        return Sql(
            self._queries["claim_batch"],
            {
                "consumer": self.consumer,
                "event_ids": [i.event_id for i, _ in items],
                "idempotency_keys": [i.idempotency_key for i, _ in items],
                "content_digests": [i.digest for i, _ in items],
                "event_types": [i.event_type for i, _ in items],
                "topics": [e.topic for _, e in items],
                "kafka_partitions": [e.partition for _, e in items],
                "kafka_offsets": [e.offset for _, e in items],
                "owner": self.owner,
                "lease_seconds": self.lease_seconds,
                "now": self.now,
            },
            binary=True,
        )

    def _tokens(self, claims: list[tuple[str, int]]) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "event_ids": [event_id for event_id, _ in claims],
            "tokens": [token for _, token in claims],
        }

    def release_batch(self, claims: list[tuple[str, int]]) -> Sql:
        """Give claims back that were made in a batch but not run, or whose run the database
        interrupted (no attempt counted)."""
        return Sql(self._queries["release_batch"], {**self._tokens(claims), "now": self.now})

    def release_stopped_batch(self, claims: list[tuple[str, int]]) -> Sql:
        """:meth:`release_batch` at a stop: rows another transaction holds are skipped."""
        return Sql(
            self._queries["release_stopped_batch"], {**self._tokens(claims), "now": self.now}
        )

    def succeeded_batch(self, claims: list[tuple[str, int]]) -> HandlerSql:
        """The ``succeeded`` marks of a batch, in its transaction -> the event ids marked."""
        params = {**self._tokens(claims), "idle_ms": self.quiet_ms}
        return HandlerSql(self._queries["mark_succeeded_batch"], params, binary=True)

    def reject_plainly(
        self, env: Envelope, reason: str, ident: Identity | None
    ) -> tuple[Sql, str | None]:
        """:meth:`reject` after the database refused it once: the id, the event type or the
        reason may be what it refuses (a value it cannot store, a session encoding that lacks
        a character). Only what any session stores: a hash of the id, no event type, the
        reason escaped to ASCII. Returns the statement and the id it records."""
        event_id = hashed(ident.event_id.encode("utf-8", "surrogatepass")) if ident else None
        plain = reason.encode("ascii", "backslashreplace").decode("ascii")
        return self.reject(env, plain, event_id=event_id, event_type=False), event_id

    def state(self, event_id: str) -> Sql:
        """-> one row ``(state, content_digest, attempts, last_error)``, or none."""
        return self._sql("get_state", event_id)

    def reject(
        self,
        env: Envelope,
        reason: str,
        ident: Identity | None = None,
        *,
        event_id: str | None = None,
        event_type: bool = True,
    ) -> Sql:
        """A delivery refused without touching an inbox row (the rejection log).

        ``event_id`` names a delivery without a usable identity (e.g. a hashed refused id);
        ``event_type=False`` leaves the event type out (the database refused it once).
        """
        found = ident.event_type if ident else env.headers.get("event-type")
        found = found if event_type else None
        if found is not None and (len(found) > 255 or not found.isprintable()):
            found = None  # refused header: its excerpt is in the reason
        return self._sql(
            "record_rejection",
            ident.event_id if ident else event_id,
            reason=bounded(reason),
            content_digest=ident.digest if ident else None,
            event_type=found,
            topic=env.topic,
            kafka_partition=env.partition,
            kafka_offset=env.offset,
        )

    def renew(self, event_id: str, token: int) -> Sql:
        return self._sql(
            "renew_lease", event_id, token=token, lease_seconds=self.lease_seconds, now=self.now
        )

    def succeeded(self, event_id: str, token: int) -> HandlerSql:
        """The ``succeeded`` mark, run in the handler's own transaction."""
        step = self._sql("mark_succeeded", event_id, token=token, idle_ms=self.quiet_ms)
        return HandlerSql(step.query, step.params)

    def record_failure(self, event_id: str, token: int, error: str) -> Sql:
        return self._sql("record_failure", event_id, token=token, error=error, now=self.now)

    def finish(self, event_id: str, token: int, state: InboxState, error: str) -> Sql:
        """``dead`` or ``rejected``, by the handler run that holds the token."""
        return self._sql("finish", event_id, token=token, state=state.value, error=error)

    def abandon(self, event_id: str, error: str) -> Sql:
        """``dead`` whatever the token: a delivery given up after repeated unexpected errors."""
        return self._sql("abandon", event_id, error=bounded(error))

    def abandon_gone(
        self, event_id: str, topic: str, partition: int, offset: int, replaced: bool = False
    ) -> Sql:
        """``dead``: the record held for this event's retry left the log (only while the row
        still names that record); ``replaced``: the whole log did (a topic recreated)."""
        why = LOG_REPLACED if replaced else "retention, compaction or delete_records"
        error = (
            f"its record ({topic}/{partition} at offset {offset}) left the log ({why})"
            " while held for a retry"
        )
        return self._sql(
            "abandon_gone",
            event_id,
            error=bounded(error),
            topic=topic,
            kafka_partition=partition,
            kafka_offset=offset,
        )

    def record_lease_lost(self, event_id: str, error: str) -> Sql:
        return self._sql("record_lease_lost", event_id, error=error)

    def claim_plan(self, ident: Identity, env: Envelope) -> Plan[Claim]:
        """Claim the row: a new one, or a takeover; else a duplicate or a reused id."""
        while True:
            claimed: db.Result = yield self.claim(ident, env)
            if claimed.rows:
                token, attempts, previous_error = claimed.rows[0]
                return Claim("claimed", token, attempts, previous_error)
            claim = yield from self.unclaimed_plan(ident)
            if claim is not None:
                return claim
            # deleted by retention between the two statements: claim again

    def unclaimed_plan(self, ident: Identity) -> Plan[Claim | None]:
        """Why a claim matched nothing: a duplicate (counted) or a reused id; ``None`` if the
        row is gone (purged meanwhile)."""
        existing: db.Result = yield self.state(ident.event_id)
        if not existing.rows:
            return None
        claim = classify(existing.rows[0], ident)
        if claim.kind == "duplicate":
            yield self._sql("count_duplicate", ident.event_id)
        return claim


def classify(row: tuple[Any, ...], ident: Identity) -> Claim:
    """After a claim matched nothing: a duplicate of a finished event (with the row's attempts
    and last error, for its acknowledgement), or a reused id."""
    state, digest = row[0], row[1]
    same = digest is None or bytes(digest) == ident.digest
    if state in TERMINAL_INBOX_STATES and same:
        return Claim("duplicate", attempts=row[2], previous_error=row[3], existing_state=state)
    return Claim("conflict", existing_state=state)
