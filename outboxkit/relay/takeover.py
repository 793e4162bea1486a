"""An exactly-once takeover's work before it publishes: fence, reconcile, record.

Reconcile: the rows of every slot's last committed checkpoint are marked published (the holder
before may have died between the Kafka commit and its mark).

Fence: an exactly-once holder uses ``producers_per_shard`` transactional ids (slots) in turn; a
takeover fences the old holder's producers by initialising each id again. A holder started
with fewer slots than the one before (``producers_per_shard`` lowered) would leave the old
holder's other ids unfenced, and a zombie stalled inside a commit on one of them could still
commit after the takeover: its rows would go out twice. So every acquire raises
``relay_lease.producer_slots`` to its own count before any slot is used, and a takeover fences
every slot up to what it finds there, reconciles their checkpoints, then records its own count.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg

from outboxkit import db
from outboxkit.kafka.api import TransactionalProducer
from outboxkit.relay.checkpoint import CheckpointTopic
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.reader import ShardStore
from outboxkit.relay.waiting import finished_unless
from outboxkit.settings import MAX_PRODUCERS_PER_SHARD, Mode, RelaySettings

logger = logging.getLogger("outboxkit.relay.shard_worker")  # the takeover's lines, as before

ProducerFactory = Callable[[int, int], TransactionalProducer]


def producer_slots(config: RelaySettings) -> int:
    """The transactional ids a holder uses: none in at-least-once mode."""
    return config.producers_per_shard if config.mode is Mode.EXACTLY_ONCE else 0


async def fence_slots(
    factory: ProducerFactory, shard: int, slots: range, stop: asyncio.Event
) -> bool:
    """Initialise the ids of ``slots`` (fencing their zombies, ending their open transactions),
    all at once, then close those producers; False if ``stop`` came first."""
    producers = [factory(shard, slot) for slot in slots]
    try:
        started = asyncio.gather(*(producer.start() for producer in producers))
        return await finished_unless(asyncio.ensure_future(started), stop)
    finally:
        for producer in producers:
            await producer.close()


async def record_slots(
    conn: psycopg.AsyncConnection[Any],
    schema: str,
    term: LeaseTerm,
    slots: int,
    now: datetime | None = None,
) -> None:
    """Only this term's own slots may be in use from now on (the others were fenced)."""
    params = {**term.sql_params(now), "slots": slots}
    await db.execute_async(conn, db.query("relay", "lease_slots_fenced", schema), params)


async def reconcile(
    store: ShardStore,
    conn: psycopg.AsyncConnection[Any],
    term: LeaseTerm,
    checkpoints: CheckpointTopic,
    *,
    delete: bool,
) -> int:
    """Mark (or delete) the rows of every slot's last committed checkpoint, oldest first; every
    slot a shard may use is read, whatever this holder uses. The rows changed."""
    found = await checkpoints.all_committed(
        term.group, term.shard, MAX_PRODUCERS_PER_SHARD, term.token
    )
    term.check()
    changed = 0
    for last in found:
        changed += await store.reconcile(conn, term, last.rows, delete=delete)
    if changed:
        logger.info(
            "shard %s: reconciled %d row(s) committed to Kafka by token %s",
            term.shard,
            changed,
            found[-1].token,
        )
    return changed
