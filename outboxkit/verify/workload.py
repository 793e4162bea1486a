"""The application ``outboxkit verify`` runs: its tables, its event and its consumer handlers.

Writers and consumers are separate processes, so what they share lives here: the table holding
each key's commit sequence (the writers' proof of per-key order), the effect table the handlers
write to (deliberately without a unique constraint: only the inbox may prevent a second effect),
and the registries ``outboxkit inbox run --registry`` loads.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outboxkit.inbox import EventRegistry, HandlerContext

EVENT_TYPE = "outboxkit.verify.event"
# The run's own outboxkit schema: its relays never see (or publish) another application's rows,
# and the shard count can be set for the run without touching anyone's deployment.
SCHEMA = "outboxkit_verify"
SEQ_TABLE = f"{SCHEMA}.verify_key_seq"
EFFECT_TABLE = f"{SCHEMA}.verify_effect"

DDL = (
    f"CREATE TABLE IF NOT EXISTS {SEQ_TABLE} (topic text NOT NULL, key text NOT NULL,"
    " seq bigint NOT NULL, PRIMARY KEY (topic, key))",
    f"CREATE TABLE IF NOT EXISTS {EFFECT_TABLE} (id bigint GENERATED ALWAYS AS IDENTITY"
    " PRIMARY KEY, consumer text NOT NULL, event_id text NOT NULL, lease_token bigint,"
    " applied_at timestamptz NOT NULL DEFAULT now())",
    f"CREATE INDEX IF NOT EXISTS verify_effect_consumer_idx ON {EFFECT_TABLE} (consumer)",
)

NEXT_SEQ = sa.text(
    f"INSERT INTO {SEQ_TABLE} (topic, key, seq) VALUES (:topic, :key, 1)"
    f" ON CONFLICT (topic, key) DO UPDATE SET seq = {SEQ_TABLE}.seq + 1 RETURNING seq"
)
INSERT_EFFECT = sa.text(
    f"INSERT INTO {EFFECT_TABLE} (consumer, event_id, lease_token)"
    " VALUES (:consumer, :event_id, :token)"
)


class VerifyEvent(BaseModel):
    """The payload every writer sends; ``seq`` is the key's commit sequence."""

    writer: int
    n: int
    key: str
    seq: int
    variant: int = 0  # another value under a reused idempotency key is "other content"


def payload_bytes(event: VerifyEvent) -> bytes:
    """The bytes the outbox stores for the event (as it serialises a pydantic model)."""
    return event.model_dump_json().encode()


SYNC = EventRegistry()  # for the confluent-kafka driver
ASYNC = EventRegistry()  # for the aiokafka driver


def _params(ctx: HandlerContext) -> dict[str, Any]:
    return {"consumer": ctx.consumer, "event_id": ctx.event_id, "token": ctx.lease_token}


@SYNC.handler(VerifyEvent, event_type=EVENT_TYPE)
def handle(event: VerifyEvent, ctx: HandlerContext, session: Session) -> None:
    session.execute(INSERT_EFFECT, _params(ctx))


@ASYNC.handler(VerifyEvent, event_type=EVENT_TYPE)
async def handle_async(event: VerifyEvent, ctx: HandlerContext, session: AsyncSession) -> None:
    await session.execute(INSERT_EFFECT, _params(ctx))
