"""Reading outcomes back, cancelling events, forgetting dead ones for a replay: the operator's
and the application's API.

All functions take a SQLAlchemy ``Engine`` and run one short transaction each (statements from
``db/sql/inbox.sql``, run through :mod:`outboxkit.db`).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy.engine import Engine

from outboxkit import db
from outboxkit.errors import InvalidEventIdError
from outboxkit.inbox.guard import bounded, event_id_problem
from outboxkit.schema import DEFAULT_SCHEMA, InboxState, check_consumer_name

EventId = str | uuid.UUID  # a writer's ``WriteResult.event_id`` is a UUID; rows store its text


@dataclass(frozen=True)
class InboxRecord:
    """One ``inbox_message`` row: how an event ended (or where it is) for one consumer."""

    consumer: str
    event_id: str
    idempotency_key: str | None
    event_type: str | None
    state: InboxState
    attempts: int
    last_error: str | None
    lease_owner: str | None
    lease_token: int | None
    lease_expires_at: dt.datetime | None
    lease_lost_count: int
    topic: str | None
    kafka_partition: int | None
    kafka_offset: int | None
    duplicate_count: int
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> InboxRecord:
        values = dict(zip([f.name for f in fields(cls)], row, strict=True))
        values["state"] = InboxState(values["state"])
        return cls(**values)

    @property
    def terminal(self) -> bool:
        return self.state.terminal


@dataclass(frozen=True)
class Rejection:
    """One ``inbox_rejection`` row: a delivery refused without touching any inbox row."""

    id: int
    consumer: str
    event_id: str | None
    reason: str
    event_type: str | None
    topic: str
    kafka_partition: int
    kafka_offset: int
    created_at: dt.datetime


REJECTION_LOG = "rejection_log"


@dataclass(frozen=True)
class StateCount:
    consumer: str
    state: str  # an inbox state, or ``rejection_log`` for the rejection table
    events: int
    duplicates: int


@dataclass(frozen=True)
class CancelResult:
    """``cancelled`` is True when this call made the event cancelled; ``state`` is the outcome."""

    cancelled: bool
    state: InboxState | None


def _rows(
    engine: Engine, name: str, schema: str, params: Mapping[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    query = db.query("inbox", name, schema)  # a bad schema name fails before connecting
    with engine.connect() as conn:
        return list(db.rows(conn, query, params))


def get_event(
    engine: Engine, consumer: str, event_id: EventId, *, schema: str = DEFAULT_SCHEMA
) -> InboxRecord | None:
    key = {"consumer": consumer, "event_id": str(event_id)}
    found = _rows(engine, "get_message", schema, key)
    return InboxRecord.from_row(found[0]) if found else None


def list_events(
    engine: Engine,
    *,
    consumer: str | None = None,
    state: InboxState | str | None = None,
    limit: int = 50,
    schema: str = DEFAULT_SCHEMA,
) -> list[InboxRecord]:
    wanted = None if state is None else InboxState(state).value
    params = {"consumer": consumer, "state": wanted, "limit": limit}
    return [InboxRecord.from_row(r) for r in _rows(engine, "list_messages", schema, params)]


def list_rejections(
    engine: Engine,
    *,
    consumer: str | None = None,
    event_id: EventId | None = None,
    limit: int = 50,
    schema: str = DEFAULT_SCHEMA,
) -> list[Rejection]:
    wanted = None if event_id is None else str(event_id)
    params = {"consumer": consumer, "event_id": wanted, "limit": limit}
    return [Rejection(*r) for r in _rows(engine, "list_rejections", schema, params)]


def stats(engine: Engine, *, schema: str = DEFAULT_SCHEMA) -> list[StateCount]:
    return [StateCount(*r) for r in _rows(engine, "stats", schema)]


def cancel_event(
    engine: Engine,
    consumer: str,
    event_id: EventId,
    *,
    reason: str = "cancelled by operator",
    before_delivery: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> CancelResult:
    """Make an event ``cancelled`` unless it already ended.

    A handler running for it is not interrupted by a lock: its lease renewal and its final
    ``succeeded`` update are refused, so its writes roll back. ``before_delivery=True`` also
    cancels an event not seen yet (its later delivery is skipped); it writes a row, so an id the
    consumer would refuse in the event-id header is an :class:`InvalidEventIdError` instead,
    and a consumer name the settings refuse a :class:`ConfigurationError`.
    """
    if before_delivery:  # a row for a name no consumer can have (settings refuse it)
        check_consumer_name("consumer", consumer)
    text = str(event_id)
    problem = event_id_problem(text) if before_delivery else None
    if problem is not None:
        raise InvalidEventIdError(
            f"event id refused ({problem}): the consumer refuses such an event-id header"
        )
    # Stored and sent as the acknowledgement's reason: capped as every stored reason is (a
    # reason of megabytes made the ``cancelled`` acknowledgement too large to publish).
    key = {"consumer": consumer, "event_id": text, "reason": bounded(reason)}
    queries = db.queries("inbox", schema)
    with engine.begin() as conn:
        done = db.execute(conn, queries["cancel"], key) == 1
        if not done and before_delivery:
            done = db.execute(conn, queries["cancel_unseen"], key) == 1
        row = db.one(conn, queries["get_state"], key)
    return CancelResult(done, None if row is None else InboxState(row[0]))


def event_state(
    engine: Engine, consumer: str, event_id: EventId, *, schema: str = DEFAULT_SCHEMA
) -> InboxState | None:
    """The state of the event's row, ``None`` when there is none (not seen, or purged)."""
    key = {"consumer": consumer, "event_id": str(event_id)}
    found = _rows(engine, "get_state", schema, key)
    return InboxState(found[0][0]) if found else None


def forget_dead(
    engine: Engine, consumer: str, event_id: EventId, *, schema: str = DEFAULT_SCHEMA
) -> bool:
    """Delete the event's row if it is ``dead`` (``inbox replay``); whether it was deleted."""
    key = {"consumer": consumer, "event_id": str(event_id)}
    query = db.query("inbox", "delete_dead", schema)
    with engine.begin() as conn:
        return db.execute(conn, query, key) == 1
