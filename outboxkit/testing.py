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
from typing import Any, TypedDict, Unpack

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


class Filters(TypedDict, total=False):
    """What to match (every given filter must match); ``schema`` defaults to ``outboxkit``."""

    event_type: str | None
    key: str | None
    topic: str | None
    aggregate_id: str | None
    schema: str


def _statement(filters: Filters) -> tuple[db.Query, dict[str, Any]]:
    params = {
        "event_type": filters.get("event_type"),
        "message_key": filters.get("key"),
        "topic": filters.get("topic"),
        "aggregate_id": filters.get("aggregate_id"),
    }
    return db.query("outbox", "select_outboxed", filters.get("schema", DEFAULT_SCHEMA)), params


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


def outboxed(target: db.SyncTarget, **filters: Unpack[Filters]) -> list[OutboxedMessage]:
    """Outbox rows visible to ``target``'s transaction that match every given filter."""
    return _to_messages(db.rows(target, *_statement(filters)))


async def outboxed_async(
    target: db.AsyncTarget, **filters: Unpack[Filters]
) -> list[OutboxedMessage]:
    """:func:`outboxed` for an AsyncSession / AsyncConnection."""
    return _to_messages(await db.rows_async(target, *_statement(filters)))


def _check(
    found: list[OutboxedMessage], count: int | None, filters: Filters
) -> list[OutboxedMessage]:
    shown = ", ".join(f"{k}={v!r}" for k, v in filters.items() if k != "schema") or "any"
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
    target: db.SyncTarget, *, count: int | None = None, **filters: Unpack[Filters]
) -> list[OutboxedMessage]:
    """Assert matching rows exist (exactly ``count`` of them if given); returns them."""
    return _check(outboxed(target, **filters), count, filters)


def assert_not_outboxed(target: db.SyncTarget, **filters: Unpack[Filters]) -> None:
    assert_outboxed(target, count=0, **filters)


async def assert_outboxed_async(
    target: db.AsyncTarget, *, count: int | None = None, **filters: Unpack[Filters]
) -> list[OutboxedMessage]:
    """:func:`assert_outboxed` for an AsyncSession / AsyncConnection."""
    return _check(await outboxed_async(target, **filters), count, filters)
