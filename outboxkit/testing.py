"""Assertions for users' tests: "did my code put this event in the outbox?".

They read the outbox through the caller's own Session/Connection (or a psycopg connection), so
they see rows the test's transaction wrote but has not committed yet::

    with Session(engine) as session, session.begin():
        place_order(session, order_id="o-1")
        assert_outboxed(session, event_type="order.placed", key="o-1", count=1)
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outboxkit import db
from outboxkit.schema import DEFAULT_SCHEMA


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


def _to_messages(rows: Sequence[tuple[Any, ...]]) -> list[OutboxedMessage]:
    """Rows of ``select_outboxed``, whose columns are the fields in order."""
    out = []
    for row in rows:
        message = OutboxedMessage(*row)
        out.append(
            dataclasses.replace(
                message, payload=bytes(message.payload), headers=dict(message.headers)
            )
        )
    return out


def outboxed(
    target: db.SyncTarget,
    *,
    event_type: str | None = None,
    key: str | None = None,
    topic: str | None = None,
    aggregate_id: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[OutboxedMessage]:
    """Outbox rows visible to ``target``'s transaction that match every given filter."""
    statement = db.query("outbox", "select_outboxed", schema)
    return _to_messages(db.rows(target, statement, _params(event_type, key, topic, aggregate_id)))


async def outboxed_async(
    target: db.AsyncTarget,
    *,
    event_type: str | None = None,
    key: str | None = None,
    topic: str | None = None,
    aggregate_id: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[OutboxedMessage]:
    statement = db.query("outbox", "select_outboxed", schema)
    params = _params(event_type, key, topic, aggregate_id)
    return _to_messages(await db.rows_async(target, statement, params))


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
    target: db.SyncTarget,
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
    target: db.SyncTarget,
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
    target: db.AsyncTarget,
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
