"""Assertions for users' tests: "did my code put this event in the outbox?".

They read the outbox through the caller's own Session/Connection, so they see rows the test's
transaction wrote but has not committed yet::

    with Session(engine) as session, session.begin():
        place_order(session, order_id="o-1")
        assert_outboxed(session, event_type="order.placed", key="o-1", count=1)
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from outboxkit.migrator import DEFAULT_SCHEMA
from outboxkit.queries import query


@dataclass(frozen=True)
class OutboxedMessage:
    """One outbox row, as a test wants to look at it."""

    id: int
    event_id: uuid.UUID
    idempotency_key: str
    topic: str
    key: str | None
    payload: bytes
    content_type: str
    headers: dict[str, str]
    event_type: str | None
    schema_version: int | None
    aggregate_type: str | None
    aggregate_id: str | None
    shard: int
    state: str
    created_at: datetime

    def json(self) -> Any:
        """The payload decoded as JSON."""
        return json.loads(self.payload)


def _params(
    event_type: str | None, key: str | None, topic: str | None, aggregate_id: str | None
) -> dict[str, Any]:
    return {
        "event_type": event_type,
        "message_key": key,
        "topic": topic,
        "aggregate_id": aggregate_id,
    }


def _to_messages(rows: Any) -> list[OutboxedMessage]:
    out = []
    for r in rows:
        out.append(
            OutboxedMessage(
                id=r.id,
                event_id=r.event_id,
                idempotency_key=r.idempotency_key,
                topic=r.topic,
                key=r.message_key,
                payload=bytes(r.payload),
                content_type=r.content_type,
                headers=dict(r.headers),
                event_type=r.event_type,
                schema_version=r.schema_version,
                aggregate_type=r.aggregate_type,
                aggregate_id=r.aggregate_id,
                shard=r.shard,
                state=r.state,
                created_at=r.created_at,
            )
        )
    return out


def outboxed(
    target: Session | Connection,
    *,
    event_type: str | None = None,
    key: str | None = None,
    topic: str | None = None,
    aggregate_id: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[OutboxedMessage]:
    """Outbox rows visible to ``target``'s transaction that match every given filter."""
    conn = target.connection() if isinstance(target, Session) else target
    sql = sa.text(query("outbox", "select_outboxed", schema))
    return _to_messages(conn.execute(sql, _params(event_type, key, topic, aggregate_id)))


async def outboxed_async(
    target: AsyncSession | AsyncConnection,
    *,
    event_type: str | None = None,
    key: str | None = None,
    topic: str | None = None,
    aggregate_id: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[OutboxedMessage]:
    conn = await target.connection() if isinstance(target, AsyncSession) else target
    sql = sa.text(query("outbox", "select_outboxed", schema))
    result = await conn.execute(sql, _params(event_type, key, topic, aggregate_id))
    return _to_messages(result)


def _check(
    found: list[OutboxedMessage], count: int | None, filters: dict[str, Any]
) -> list[OutboxedMessage]:
    shown = ", ".join(f"{k}={v!r}" for k, v in filters.items() if v is not None) or "any"
    if count is None and not found:
        raise AssertionError(f"expected an outboxed message matching {shown}, found none")
    if count is not None and len(found) != count:
        listing = "".join(
            f"\n  #{m.id} {m.topic} type={m.event_type!r} key={m.key!r}" for m in found
        )
        raise AssertionError(
            f"expected {count} outboxed message(s) matching {shown}, found {len(found)}{listing}"
        )
    return found


def assert_outboxed(
    target: Session | Connection,
    *,
    event_type: str | None = None,
    key: str | None = None,
    topic: str | None = None,
    aggregate_id: str | None = None,
    count: int | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[OutboxedMessage]:
    """Assert matching rows exist (exactly ``count`` of them if given); returns them."""
    filters = {"event_type": event_type, "key": key, "topic": topic, "aggregate_id": aggregate_id}
    found = outboxed(
        target,
        event_type=event_type,
        key=key,
        topic=topic,
        aggregate_id=aggregate_id,
        schema=schema,
    )
    return _check(found, count, filters)


def assert_not_outboxed(
    target: Session | Connection,
    *,
    event_type: str | None = None,
    key: str | None = None,
    topic: str | None = None,
    aggregate_id: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> None:
    assert_outboxed(
        target,
        event_type=event_type,
        key=key,
        topic=topic,
        aggregate_id=aggregate_id,
        count=0,
        schema=schema,
    )


async def assert_outboxed_async(
    target: AsyncSession | AsyncConnection,
    *,
    event_type: str | None = None,
    key: str | None = None,
    topic: str | None = None,
    aggregate_id: str | None = None,
    count: int | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[OutboxedMessage]:
    filters = {"event_type": event_type, "key": key, "topic": topic, "aggregate_id": aggregate_id}
    found = await outboxed_async(
        target,
        event_type=event_type,
        key=key,
        topic=topic,
        aggregate_id=aggregate_id,
        schema=schema,
    )
    return _check(found, count, filters)
