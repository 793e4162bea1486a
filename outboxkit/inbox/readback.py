"""Reading outcomes back and cancelling events: the operator's and the application's API.

All functions take a SQLAlchemy ``Engine`` and run one short transaction each.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine

from outboxkit.migrator import DEFAULT_SCHEMA
from outboxkit.queries import query


@dataclass(frozen=True)
class InboxRecord:
    """One ``inbox_message`` row: how an event ended (or where it is) for one consumer."""

    consumer: str
    event_id: str
    idempotency_key: str | None
    event_type: str | None
    state: str
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

    @property
    def terminal(self) -> bool:
        return self.state != "processing"


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
    state: str | None


def _q(name: str, schema: str) -> Any:
    return text(query("inbox", name, schema))


def get_event(
    engine: Engine, consumer: str, event_id: str, *, schema: str = DEFAULT_SCHEMA
) -> InboxRecord | None:
    with engine.begin() as conn:
        row = conn.execute(
            _q("get_message", schema), {"consumer": consumer, "event_id": event_id}
        ).first()
    return None if row is None else InboxRecord(*row)


def list_events(
    engine: Engine,
    *,
    consumer: str | None = None,
    state: str | None = None,
    limit: int = 50,
    schema: str = DEFAULT_SCHEMA,
) -> list[InboxRecord]:
    params = {"consumer": consumer, "state": state, "limit": limit}
    with engine.begin() as conn:
        return [InboxRecord(*row) for row in conn.execute(_q("list_messages", schema), params)]


def list_rejections(
    engine: Engine,
    *,
    consumer: str | None = None,
    event_id: str | None = None,
    limit: int = 50,
    schema: str = DEFAULT_SCHEMA,
) -> list[Rejection]:
    params = {"consumer": consumer, "event_id": event_id, "limit": limit}
    with engine.begin() as conn:
        return [Rejection(*row) for row in conn.execute(_q("list_rejections", schema), params)]


def stats(engine: Engine, *, schema: str = DEFAULT_SCHEMA) -> list[StateCount]:
    with engine.begin() as conn:
        return [StateCount(*row) for row in conn.execute(_q("stats", schema))]


def cancel_event(
    engine: Engine,
    consumer: str,
    event_id: str,
    *,
    reason: str = "cancelled by operator",
    before_delivery: bool = False,
    schema: str = DEFAULT_SCHEMA,
) -> CancelResult:
    """Make an event ``cancelled`` unless it already ended.

    A handler running for it is not interrupted by a lock: its lease renewal and its final
    ``succeeded`` update are refused, so its writes roll back. ``before_delivery=True`` also
    cancels an event not seen yet (its later delivery is skipped).
    """
    key = {"consumer": consumer, "event_id": event_id, "reason": reason}
    with engine.begin() as conn:
        done = conn.execute(_q("cancel", schema), key).rowcount == 1
        if not done and before_delivery:
            done = conn.execute(_q("cancel_unseen", schema), key).rowcount == 1
        row = conn.execute(_q("get_state", schema), key).first()
    return CancelResult(done, None if row is None else str(row[0]))
