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
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from outboxkit.errors import PublishError
from outboxkit.faults import FaultPoints
from outboxkit.kafka.api import ProduceRequest, RecordError, TransactionalProducer
from outboxkit.kafka.errors import ErrorKind
from outboxkit.relay.checkpoint import CheckpointTopic
from outboxkit.relay.checkpoint_writer import CheckpointWriter, too_large
from outboxkit.relay.claim_size import ClaimSizer
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.owed_marks import OwedMarks
from outboxkit.relay.publish_stats import PublishStats
from outboxkit.relay.reader import OutboxRecord, ShardStore, produce_requests
from outboxkit.relay.topic_gate import TopicGate
from outboxkit.settings import Mode, OnPublish, ParkedKeyPolicy, RelaySettings

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
        stop: asyncio.Event | None = None,
    ) -> None:
        self.config = config
        self._stop = stop if stop is not None else asyncio.Event()  # the worker's (SIGTERM)
        self.shard = shard
        self._store = store
        self._metrics = metrics
        self._faults = faults
        self._label = str(shard)
        self._isolate_remaining = 0
        self._gate = TopicGate(
            shard,
            store,
            metrics,
            wait_behind_parked=config.parked_key_policy is ParkedKeyPolicy.WAIT,
            checkpoint_topic=config.checkpoint_topic,
            stop=self._stop,
        )
        self._limits = self._gate.limits  # sends may be cut (at_least_once: broker_limits)
        self._pending_mark: asyncio.Task[None] | None = None
        self._owed = OwedMarks(enabled=config.mode is Mode.AT_LEAST_ONCE)
        self._one_claim_transactions = 0  # after a permanent error in several claims (below)
        # The next claim and its records, built ahead (see ``_claim``); used only for that claim.
        self._prepared: tuple[list[OutboxRecord], list[ProduceRequest]] | None = None
        self.stats = PublishStats()
        self._sizer = ClaimSizer.for_relay(config)  # no claim passes transaction_max_rows
        self._checkpoints = CheckpointWriter(config, shard, checkpoints, self._sizer)

    @property
    def limit(self) -> int:
        """Rows of the next claim (adaptive, see ``claim_size``); 1 while a batch with a
        permanently bad record is being isolated, ``batch_size`` while the claims of a failed
        transaction are retried one per transaction (the bad claim, isolated next, stays small)."""
        if self._isolate_remaining > 0:
            return 1
        if self._one_claim_transactions > 0:
            return self._sizer.low
        return self._sizer.size

    async def claim(
        self, conn: Conn, limit: int | None = None, in_flight: Sequence[int] = ()
    ) -> list[OutboxRecord]:
        """Claim pending rows (``limit``, default ``self.limit``) and adapt the next size."""
        asked = self.limit if limit is None else limit
        found = await self._store.claim(conn, self.shard, asked, in_flight)
        # No growth while a failed transaction is retried or isolated: those claims are small
        # on purpose, and growing from them would put the bad row back into a large claim.
        grow = self._isolate_remaining == 0 and self._one_claim_transactions == 0
        self._sizer.observe(asked, len(found), self._store.claimed_bytes, grow=grow)
        if found:
            self.stats.claims += 1
            self.stats.largest_claim = max(self.stats.largest_claim, len(found))
        return found

    def new_producer_life(self) -> None:
        """Topic knowledge and the defects of rows claimed belong to one producer life."""
        self._gate.forget()
        self._store.defects.clear()
        self._prepared = None

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

    async def pay_owed_marks(self, term: LeaseTerm, conn: Conn) -> None:
        """At a term's start, before any claim: mark what earlier terms sent and could not
        mark (``at_least_once``; see ``owed_marks``). Raises as a mark does."""
        delete = self.config.on_publish is OnPublish.DELETE
        changed = await self._owed.pay(self._store, conn, term, delete=delete)
        if changed is not None:  # a mark committed: the term works
            self.stats.marks += 1
            self._metrics.published.labels(self._label).inc(changed)

    async def _mark(self, term: LeaseTerm, conn: Conn, ids: list[int]) -> None:
        delete = self.config.on_publish is OnPublish.DELETE
        changed = await self._store.mark_published(conn, term, ids, delete=delete)
        self._owed.paid(ids)
        self.stats.marks += 1  # committed: what tells the worker that its term works
        # Counted as marked, not at the Kafka commit: a batch whose mark failed is marked by a
        # later term's reconciliation, which counts it then (before, it was counted twice).
        self._metrics.published.labels(self._label).inc(changed)
        self._faults.reach("after_mark")

    def _next_limit(self, rows: int, started: float) -> int:
        """Rows of the open transaction's next claim (``rows`` sent so far); 0: it commits.

        Only under backlog (see ``ClaimSizer.next_of_transaction``), and not once the worker
        stops: shutdown does not wait for the transaction to fill up.
        """
        if self._isolate_remaining > 0 or self._one_claim_transactions > 0 or self._stop.is_set():
            return 0
        return self._sizer.next_of_transaction(rows, time.monotonic() - started)

    async def publish(
        self,
        term: LeaseTerm,
        conn: Conn,
        producer: TransactionalProducer,
        batch: list[OutboxRecord],
        slot: int = 0,
    ) -> tuple[Outcome, list[OutboxRecord]]:
        """One Kafka transaction on ``producer`` (the shard's producer ``slot``) that starts with
        ``batch`` and, under backlog, carries further claims (``_next_limit``); then its commit.

        The caller hands the next transaction to another slot only after this returns, i.e.
        after this commit returned: transactions of one shard commit strictly in turn. Returns
        the outcome and the first claim of the next transaction (claimed meanwhile).
        """
        started = time.monotonic()
        previous_mark, self._pending_mark = self._pending_mark, None
        carried: list[tuple[int, str]] = []  # rows sent so far (ids only: memory stays flat)
        claims = 0
        claim = batch
        began = False
        while True:
            try:
                to_send = await self._gate.sendable(term, conn, producer, claim)
                if producer.transactional and not began and to_send:
                    await producer.begin()
                    began = True
            except BaseException:
                if claims == 0:  # the old mark was not handed on yet: it stays pending, settled
                    self._pending_mark = previous_mark  # or abandoned by the caller
                raise
            claims += 1
            limit = self._next_limit(len(carried) + len(to_send), started)
            last = limit == 0
            if last:
                limit = self.limit  # the next transaction's first claim
            if not to_send and not carried:
                self._pending_mark = previous_mark  # nothing sent: the old mark stays pending
                return Outcome.PUBLISHED, []
            # The next claim (of this transaction, or the next one's first) runs while these
            # records go out. It starts from the lowest pending id and leaves out every row of
            # this transaction (none is marked yet): a row that committed late below them must
            # go before any newer row of its key, so no id bound is used.
            in_flight = [i for i, _ in carried] + [r.id for r in claim]
            first = claims == 1
            claim_next = functools.partial(
                self._claim, conn, previous_mark if first else None, limit, in_flight
            )
            # Without a backlog the next transaction's first claim waits for these deliveries
            # and runs during the commit: it takes the rows written meanwhile, which a claim now
            # would leave for one more transaction. Under backlog it overlaps the send.
            deferred = last and producer.transactional and not self._sizer.full
            next_claim = None if deferred else asyncio.create_task(claim_next())
            stats, deliveries = self.stats, []
            try:
                try:
                    # Let the claim reach PostgreSQL before the Python work of building and
                    # handing over these records: the database works meanwhile, not after.
                    await asyncio.sleep(0)
                    prepared, self._prepared = self._prepared, None
                    if prepared is not None and prepared[0] is to_send:
                        requests = prepared[1]  # built while the previous send was in flight
                    else:
                        requests = produce_requests(to_send)
                    if last:
                        rows = (*carried, *((r.id, r.event_id) for r in to_send))
                        requests.extend(self._checkpoints.records(term, slot, rows))
                    if first:
                        self._faults.reach("before_send")
                    # A term run out since the claim (a paused process) stops here: nothing
                    # fences an at-least-once producer (no transactional.id) once it has them.
                    term.check()
                    clock = time.monotonic()
                    deliveries = await self._limits.send(producer, requests, term.check)
                    stats.send += time.monotonic() - clock
                finally:
                    if first and previous_mark is not None:  # a lease lost marking surfaces here
                        await self._owed.awaiting(previous_mark, to_send, deliveries)
                term.check()
                failed = [
                    (record, delivery.error)
                    for record, delivery in zip(to_send, deliveries, strict=False)
                    if delivery.error is not None
                ]
                refused = deliveries[-1].error if len(deliveries) > len(to_send) else None
                if refused is not None and (not failed or too_large(refused)):
                    if next_claim is not None:
                        await next_claim  # not used, but the connection is ours again
                    return await self._checkpoint_refused(producer, refused), []
                if failed:
                    if next_claim is not None:
                        await next_claim  # not used, but the connection is ours again
                    sent = [i for i, _ in carried] + [r.id for r in to_send]
                    return await self._handle_failures(
                        term, conn, producer, sent, failed, claims
                    ), []
                carried.extend((r.id, r.event_id) for r in to_send)
                if next_claim is None:  # deferred: it runs during the commit below
                    next_claim = asyncio.create_task(claim_next())
                    await asyncio.sleep(0)  # its statement on the wire before the commit's
                    break
                clock = time.monotonic()
                following = await next_claim
                next_claim = None
                stats.claim_wait += time.monotonic() - clock
                term.check()
            except BaseException:
                if next_claim is not None:
                    await _retrieve(next_claim)
                raise
            if last:
                break
            if not following:  # drained right at a claim boundary: the checkpoint goes alone
                if refused := await self._checkpoints.send_alone(term, producer, slot, carried):
                    return await self._checkpoint_refused(producer, refused), []
                break
            self._faults.reach("between_claims")
            claim = following
        clock = time.monotonic()
        try:
            await self._commit(term, producer, slot)
        except BaseException:
            if next_claim is not None:
                await _retrieve(next_claim)
            raise
        self._owed.owe(carried)  # Kafka has them: owed until their mark commits (at_least_once)
        self.stats.commit += time.monotonic() - clock
        self.stats.transactions += 1
        self.stats.rows += len(carried)
        if self._one_claim_transactions > 0:
            self._one_claim_transactions -= 1
        if self._isolate_remaining > 0:
            self._isolate_remaining -= len(carried)
        if next_claim is not None:  # the deferred first claim of the next transaction
            clock = time.monotonic()
            following = await next_claim
            self.stats.claim_wait += time.monotonic() - clock
            term.check()
        # The mark runs while the next transaction goes to Kafka; it is awaited before that
        # one's commit. Yield once so its statement is on the wire before the next CPU work.
        ids = [i for i, _ in carried]
        self._pending_mark = asyncio.create_task(self._mark(term, conn, ids))
        await asyncio.sleep(0)
        self._metrics.batch_seconds.labels(self._label).observe(time.monotonic() - started)
        return Outcome.PUBLISHED, following if last else []

    async def _claim(
        self,
        conn: Conn,
        previous_mark: asyncio.Task[None] | None,
        limit: int,
        in_flight: list[int],
    ) -> list[OutboxRecord]:
        if previous_mark is not None:
            await previous_mark  # the connection does one thing at a time; marks come first
        found = await self.claim(conn, limit, in_flight)
        # Its records are built here, while the current claim's deliveries are awaited (in the
        # client's thread), instead of afterwards on the loop's critical path.
        self._prepared = (found, produce_requests(found))
        return found

    async def _checkpoint_refused(
        self, producer: TransactionalProducer, error: RecordError
    ) -> Outcome:
        """A checkpoint too large: smaller transactions, retried at once (this one aborted, its
        rows unmarked); any other checkpoint error raises (back-off)."""
        self._checkpoints.refused(error)
        with contextlib.suppress(PublishError):
            await producer.abort()
        return Outcome.RETRY_NOW

    async def _commit(self, term: LeaseTerm, producer: TransactionalProducer, slot: int) -> None:
        self._faults.reach("after_produce")
        # The previous transaction's mark is settled (in the first send): only now may this one
        # commit (exactly-once: if we die after it, this transaction's checkpoint is the last
        # committed one, and the successor marks only its rows).
        if producer.transactional:
            self._faults.reach(f"before_commit_slot{slot}")
            await producer.commit()
            term.check()
            self._faults.reach(f"after_commit_slot{slot}")
        self._faults.reach("after_kafka_commit")

    async def _handle_failures(
        self,
        term: LeaseTerm,
        conn: Conn,
        producer: TransactionalProducer,
        sent: list[int],
        failed: list[tuple[OutboxRecord, RecordError]],
        claims: int,
    ) -> Outcome:
        """Nothing of a failed transaction is marked; it is retried whole, in the same order."""
        if producer.transactional:
            with contextlib.suppress(PublishError):
                await producer.abort()
        if permanent := [(r, e) for r, e in failed if e.kind is ErrorKind.PERMANENT]:
            self._sizer.reset()  # what is retried, and maybe isolated row by row, stays small
            self._limits.refused((r.topic, e) for r, e in permanent)  # maybe a changed limit
        alone = self._limits.alone is not None and not producer.transactional  # never in a txn
        if permanent and (len(sent) == 1 or alone):  # refused alone, or in a send of its own:
            record, error = failed[0]  # the bad one; at least once, those acked before it stay
            if alone and (acked := sent[: sent.index(record.id)]):  # (its key waits: parked)
                await self._mark(term, conn, acked)
            await self._gate.park(term, conn, record, str(error))
            self._isolate_remaining = max(0, self._isolate_remaining - 1)
            return Outcome.RETRY_NOW
        if permanent and (claims > 1 or len(sent) > self._sizer.low):
            # Retry the rows in transactions of one claim of batch_size each, so the bad claim
            # fails alone and only its rows (at most batch_size) are isolated one by one: the
            # claims of the failed transaction may have grown; these do not.
            self._one_claim_transactions = -(-len(sent) // self._sizer.low)
            return Outcome.RETRY_NOW
        if permanent:
            # A broker may reject a whole request for one bad record: find it one row at a time.
            self._isolate_remaining = len(sent)
            logger.info("shard %s: %s; isolating rows", self.shard, permanent[0][1])
            return Outcome.RETRY_NOW
        first_error = failed[0][1]
        await self._store.record_failure(conn, term, sent, str(first_error))
        logger.warning(
            "shard %s: %d row(s) failed transiently (%s); batch will be retried in order",
            self.shard,
            len(failed),
            first_error,
        )
        return Outcome.RETRY_LATER


async def _retrieve(task: asyncio.Task[Any]) -> None:
    """Let a side task finish (the connection is ours again) and retrieve its outcome."""
    if not task.done():
        with contextlib.suppress(Exception):
            await task
    elif not task.cancelled():
        task.exception()  # retrieved: a lease lost is raised once, by the caller
