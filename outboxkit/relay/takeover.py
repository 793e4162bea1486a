"""An exactly-once takeover's work before it publishes: fence, reconcile, record.

Reconcile: the rows of every slot's last committed checkpoint are marked published (the holder
before may have died between the Kafka commit and its mark).

Fence: an exactly-once holder uses ``producers_per_shard`` transactional ids (slots) in turn;
a takeover fences the old holder's producers by initialising each id again. A holder started
with fewer slots than the one before (``producers_per_shard`` lowered) would leave the old
holder's other ids unfenced, and a zombie stalled inside a commit on one of them could still
commit after the takeover: its rows would go out twice. So a takeover first raises the shard's
recorded count (``relay_producer_slots``) to its own, before any slot is used, fences every
slot up to what it found there, reconciles, then records its own count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from outboxkit.errors import PublishError
from outboxkit.kafka.api import TransactionalProducer
from outboxkit.relay.checkpoint import CheckpointTopic
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.reader import ShardStore
from outboxkit.relay.waiting import finished_unless
from outboxkit.settings import MAX_PRODUCERS_PER_SHARD

logger = logging.getLogger("outboxkit.relay.shard_worker")  # the takeover's lines, as before

ProducerFactory = Callable[[int, int], TransactionalProducer]


async def fence_slots(
    factory: ProducerFactory, term: LeaseTerm, slots: range, stop: asyncio.Event
) -> bool:
    """Initialise the ids of ``slots`` (fencing their zombies, ending their open transactions),
    all at once, then close those producers; False if ``stop`` came first."""
    term.check()  # a term lost meanwhile must not fence a successor's producers
    producers = [factory(term.shard, slot) for slot in slots]
    starts = [asyncio.ensure_future(producer.start()) for producer in producers]
    try:
        done = await finished_unless(asyncio.ensure_future(_all(starts)), stop)
    except Exception as exc:
        raise PublishError(
            f"shard {term.shard}: fencing the transactional ids of slots"
            f" {slots.start}-{slots.stop - 1}, which an earlier holder of the shard used"
            f" (producers_per_shard was higher), failed: {exc}"
        ) from exc
    finally:
        for start in starts:  # none left running while its producer closes
            start.cancel()
        await asyncio.gather(*starts, return_exceptions=True)
        for producer in producers:
            with contextlib.suppress(Exception):
                await producer.close()
    if done:
        logger.info(
            "shard %s: fenced slots %d-%d, which an earlier holder used",
            term.shard,
            slots.start,
            slots.stop - 1,
        )
    return done


async def _all(starts: Sequence[asyncio.Future[Any]]) -> None:
    """Every start, failing as soon as one fails."""
    for finished in asyncio.as_completed(starts):
        await finished


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
