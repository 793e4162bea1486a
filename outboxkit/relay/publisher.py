"""One shard's batches: produce (+ checkpoint) in one Kafka transaction, commit, then mark.

Kept apart from the term loop (``shard_worker``): this module decides what happens to the rows
of a batch — published, parked with a permanent reason, isolated one at a time to find a bad
record, or retried whole and in order after a transient error. Every write is token-conditional;
a failed token check raises :class:`LeaseLostError` and nothing more is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from typing import Any

import psycopg

from outboxkit.errors import PublishError
from outboxkit.faults import FaultPoints
from outboxkit.kafka.api import ProduceRequest, RecordError, TransactionalProducer
from outboxkit.kafka.errors import ErrorKind
from outboxkit.relay.checkpoint import Checkpoint, CheckpointTopic
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.reader import OutboxRecord, ShardStore
from outboxkit.settings import OnPublish, ParkedKeyPolicy, RelaySettings

logger = logging.getLogger("outboxkit.relay.shard_worker")

Conn = psycopg.AsyncConnection[Any]


class Outcome(enum.Enum):
    PUBLISHED = "published"
    RETRY_NOW = "retry_now"  # a row was parked or isolation is needed; no back-off
    RETRY_LATER = "retry_later"  # transient error: back off, recreate the producer


class BatchPublisher:
    """Per-shard publishing state that outlives one batch: known-good topics, rows still to
    isolate, and the database mark of the last committed batch (still running)."""

    def __init__(
        self,
        config: RelaySettings,
        shard: int,
        *,
        store: ShardStore,
        checkpoints: CheckpointTopic | None,
        metrics: RelayMetrics,
        faults: FaultPoints,
    ) -> None:
        self.config = config
        self.shard = shard
        self._store = store
        self._checkpoints = checkpoints
        self._metrics = metrics
        self._faults = faults
        self._label = str(shard)
        self._isolate_remaining = 0
        self._known_topics: set[str] = set()
        self._pending_mark: asyncio.Task[None] | None = None
        self._seq = 0  # checkpoint commit order within a term (never reset: lives share a term)

    @property
    def limit(self) -> int:
        """Batch size, or 1 while a batch with a permanently bad record is being isolated."""
        return 1 if self._isolate_remaining > 0 else self.config.batch_size

    def new_producer_life(self) -> None:
        """Topic knowledge belongs to one producer life (its metadata)."""
        self._known_topics.clear()

    async def settle_mark(self) -> None:
        """Wait for the database mark of the last committed batch (raises lease lost)."""
        pending, self._pending_mark = self._pending_mark, None
        if pending is not None:
            await pending

    async def abandon_mark(self) -> None:
        """The term is over: a mark still running is cancelled (its token check protects us)."""
        pending, self._pending_mark = self._pending_mark, None
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pending

    async def _mark(self, term: LeaseTerm, conn: Conn, ids: list[int]) -> None:
        await self._store.mark_published(
            conn, term, ids, delete=self.config.on_publish is OnPublish.DELETE
        )
        self._faults.reach("after_mark")

    async def _topic_problem(
        self, producer: TransactionalProducer, topic: str
    ) -> RecordError | None:
        if topic in self._known_topics:
            return None
        problem = await producer.topic_problem(topic)
        if problem is None:
            self._known_topics.add(topic)
        return problem

    async def _park(self, term: LeaseTerm, conn: Conn, record: OutboxRecord, why: str) -> None:
        await self._store.park(conn, term, record.id, why)
        self._metrics.parked.labels(self._label).inc()
        logger.warning(
            "shard %s: parked row %s (topic %s): %s", self.shard, record.id, record.topic, why
        )

    async def _park_unsendable(
        self,
        term: LeaseTerm,
        conn: Conn,
        batch: list[OutboxRecord],
        problems: dict[str, RecordError],
    ) -> list[OutboxRecord]:
        """Park the rows whose topic cannot take records; the rest of the batch, in order."""
        wait_behind_parked = self.config.parked_key_policy is ParkedKeyPolicy.WAIT
        parked_keys: set[str] = set()
        to_send: list[OutboxRecord] = []
        for record in batch:
            if wait_behind_parked and record.key is not None and record.key in parked_keys:
                continue  # waits behind its parked predecessor; the next claim excludes it
            problem = problems.get(record.topic)
            if problem is not None:
                await self._park(term, conn, record, str(problem))
                term.check()
                if record.key is not None:
                    parked_keys.add(record.key)
                continue
            to_send.append(record)
        return to_send

    async def publish(
        self,
        term: LeaseTerm,
        conn: Conn,
        producer: TransactionalProducer,
        batch: list[OutboxRecord],
        slot: int = 0,
    ) -> tuple[Outcome, list[OutboxRecord]]:
        """Send one batch (one Kafka transaction on ``producer``, the shard's producer ``slot``).

        The caller hands the next batch to another slot only after this returns, i.e. after
        this transaction's commit returned: transactions of one shard commit strictly in turn.
        """
        started = time.monotonic()
        # Each topic is checked once per batch (and known-good topics not at all), not per row.
        problems: dict[str, RecordError] = {}
        for topic in {r.topic for r in batch} - self._known_topics:
            problem = await self._topic_problem(producer, topic)
            term.check()
            if problem is not None:
                problems[topic] = problem
        if problems:
            to_send = await self._park_unsendable(term, conn, batch, problems)
            if not to_send:
                return Outcome.PUBLISHED, []
        else:
            to_send = batch
        requests = [
            ProduceRequest(
                r.topic,
                r.key.encode() if r.key is not None else None,
                r.payload,
                r.kafka_headers(),
            )
            for r in to_send
        ]
        if self._checkpoints is not None:
            await producer.begin()
            checkpoint = Checkpoint(
                self.config.group,
                self.shard,
                term.token,
                tuple((r.id, r.event_id) for r in to_send),
                slot,
                self._seq,
            )
            self._seq += 1
            requests.append(self._checkpoints.request(checkpoint))
        # While Kafka takes this batch, the database side settles the previous batch's mark and
        # claims the next batch (excluding this one's rows): one batch in flight, order kept.
        in_flight = [r.id for r in batch]
        limit = self.limit
        previous_mark, self._pending_mark = self._pending_mark, None

        async def claim_next() -> list[OutboxRecord]:
            if previous_mark is not None:
                await previous_mark
            return await self._store.claim(conn, self.shard, limit, in_flight)

        next_batch = asyncio.create_task(claim_next())
        try:
            try:
                self._faults.reach("before_send")
                deliveries = await producer.send(requests)
            finally:
                if previous_mark is not None:
                    await previous_mark  # a lease lost while marking surfaces here
            term.check()
            failed = [
                (record, delivery.error)
                for record, delivery in zip(to_send, deliveries, strict=False)
                if delivery.error is not None
            ]
            if not failed and len(deliveries) > len(to_send) and deliveries[-1].error is not None:
                raise PublishError(f"checkpoint record failed: {deliveries[-1].error}")
            if failed:
                await next_batch  # not used, but the connection is ours again
                outcome = await self._handle_failures(term, conn, producer, to_send, failed)
                return outcome, []
            self._faults.reach("after_produce")
            # The previous batch's mark is settled (above): only now may this batch commit
            # (exactly-once: if we die after it, this batch's checkpoint is the last committed
            # one, and the successor marks only its rows). The claim may still be running.
            if producer.transactional:
                self._faults.reach(f"before_commit_slot{slot}")
                await producer.commit()
                term.check()
                self._faults.reach(f"after_commit_slot{slot}")
            self._faults.reach("after_kafka_commit")
            prefetched = await next_batch
            term.check()
        except BaseException:
            if not next_batch.done():
                with contextlib.suppress(Exception):
                    await next_batch
            elif not next_batch.cancelled():
                next_batch.exception()  # retrieved: a lease lost is raised once, above
            raise
        ids = [r.id for r in to_send]
        # The mark runs while the next batch goes to Kafka; it is awaited before that batch's
        # commit. Yield once so its statement is on the wire before the next batch's CPU work.
        self._pending_mark = asyncio.create_task(self._mark(term, conn, ids))
        await asyncio.sleep(0)
        if self._isolate_remaining > 0:
            self._isolate_remaining -= len(to_send)
        self._metrics.published.labels(self._label).inc(len(ids))
        self._metrics.batch_seconds.labels(self._label).observe(time.monotonic() - started)
        return Outcome.PUBLISHED, prefetched

    async def _handle_failures(
        self,
        term: LeaseTerm,
        conn: Conn,
        producer: TransactionalProducer,
        sent: list[OutboxRecord],
        failed: list[tuple[OutboxRecord, RecordError]],
    ) -> Outcome:
        """Nothing of a failed batch is marked; it is retried whole, in the same order."""
        if producer.transactional:
            with contextlib.suppress(PublishError):
                await producer.abort()
        permanent = [(r, e) for r, e in failed if e.kind is ErrorKind.PERMANENT]
        if permanent and len(sent) == 1:
            record, error = permanent[0]
            await self._park(term, conn, record, str(error))
            self._isolate_remaining = max(0, self._isolate_remaining - 1)
            return Outcome.RETRY_NOW
        if permanent:
            # A broker may reject a whole request for one bad record: find it one row at a time.
            self._isolate_remaining = len(sent)
            logger.info("shard %s: permanent error in a batch; isolating rows", self.shard)
            return Outcome.RETRY_NOW
        first_error = failed[0][1]
        await self._store.record_failure(conn, term, [r.id for r in sent], str(first_error))
        logger.warning(
            "shard %s: %d row(s) failed transiently (%s); batch will be retried in order",
            self.shard,
            len(failed),
            first_error,
        )
        return Outcome.RETRY_LATER
