"""One shard's loop: standby -> acquire lease -> (re)create producer -> reconcile -> publish.

Active term, per batch: claim pending rows -> produce (+ checkpoint) in one Kafka transaction ->
commit -> mark published (or delete), conditional on the token. After every await the worker
checks that it still holds its lease; *lease lost* is its own outcome: stop at once, publish
nothing more, mark nothing, count and log it, and go back to standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import Callable, Sequence

import psycopg

from outboxkit.errors import LeaseLostError, ProducerFencedError, PublishError
from outboxkit.relay.checkpoint import Checkpoint, CheckpointTopic
from outboxkit.relay.config import Mode, OnPublish, ParkedKeyPolicy, RelayConfig
from outboxkit.relay.faults import FaultPoints
from outboxkit.relay.lease import LeaseStore, LeaseTerm
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.producer.base import ProduceRequest, RecordError, RelayProducer
from outboxkit.relay.producer.errors import ErrorKind
from outboxkit.relay.reader import OutboxRecord, ShardStore

logger = logging.getLogger("outboxkit.relay.shard_worker")

ProducerFactory = Callable[[int], RelayProducer]


class Outcome(enum.Enum):
    PUBLISHED = "published"
    RETRY_NOW = "retry_now"  # a row was parked or isolation is needed; no back-off
    RETRY_LATER = "retry_later"  # transient error: back off, recreate the producer


def backoff_delay(attempt: int, initial: float, maximum: float, rng: random.Random) -> float:
    """Bounded exponential back-off with full jitter in [base/2, base]."""
    base = min(maximum, initial * (2 ** max(0, attempt - 1)))
    return rng.uniform(base / 2, base)


async def wait_any(events: Sequence[asyncio.Event], seconds: float) -> None:
    """Sleep up to ``seconds``, less if any of the events is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class ShardWorker:
    def __init__(
        self,
        config: RelayConfig,
        shard: int,
        *,
        holder: str,
        stop: asyncio.Event,
        producer_factory: ProducerFactory,
        checkpoints: CheckpointTopic | None,
        metrics: RelayMetrics,
        faults: FaultPoints,
    ) -> None:
        self.config = config
        self.shard = shard
        self.holder = holder
        self.stop = stop
        self.wake = asyncio.Event()
        self.active = asyncio.Event()  # set while this worker holds a trusted term (tests wait)
        self.term: LeaseTerm | None = None
        self.lease_lost_count = 0
        self.notifications = 0  # NOTIFY hints addressed to this shard (observability, tests)
        self._producer_factory = producer_factory
        self._checkpoints = checkpoints
        self._metrics = metrics
        self._faults = faults
        self._leases = LeaseStore(config.schema_name)
        self._store = ShardStore(
            config.schema_name,
            skip_parked_keys=config.parked_key_policy is ParkedKeyPolicy.SKIP,
        )
        self._rng = random.Random()
        self._label = str(shard)
        for counter in (metrics.published, metrics.failed, metrics.parked, metrics.lease_lost):
            counter.labels(self._label)  # every series exists from the start, at 0
        metrics.lease_active.labels(self._label).set(0)
        self._isolate_remaining = 0
        self._known_topics: set[str] = set()
        self._pending_mark: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- outer loop (standby)

    async def run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                await self._one_session()
                failures = 0
            except LeaseLostError as exc:
                self.lease_lost_count += 1
                self._metrics.lease_lost.labels(self._label).inc()
                logger.warning("lease lost on shard %s: %s; back to standby", self.shard, exc)
            except Exception as exc:  # a worker must never die silently: log, back off, retry
                failures += 1
                if not isinstance(exc, psycopg.Error | OSError | PublishError):
                    logger.exception("shard %s: unexpected error", self.shard)
                delay = backoff_delay(
                    failures, self.config.backoff_initial, self.config.backoff_max, self._rng
                )
                logger.warning(
                    "shard %s: %s: %s; retrying in %.2fs",
                    self.shard,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                await wait_any([self.stop], delay)
            finally:
                self.active.clear()
                self._metrics.lease_active.labels(self._label).set(0)

    async def _connect(self) -> psycopg.AsyncConnection:
        return await psycopg.AsyncConnection.connect(
            self.config.database_url.get_secret_value(),
            autocommit=True,
            application_name=f"outboxkit-relay-{self.shard}",
            connect_timeout=10,
        )

    async def _one_session(self) -> None:
        async with await self._connect() as lease_conn:
            term = await self._wait_for_lease(lease_conn)
            if term is None:
                return
            self.term = term
            try:
                async with await self._connect() as data_conn:
                    await self._active_term(term, lease_conn, data_conn)
            finally:
                await self._release(lease_conn, term)

    async def _wait_for_lease(self, conn: psycopg.AsyncConnection) -> LeaseTerm | None:
        while not self.stop.is_set():
            term = await self._leases.acquire(
                conn, self.config.relay_group, self.shard, self.holder, self.config.lease_ttl
            )
            if term is not None:
                return term
            await wait_any([self.stop], self.config.poll_interval)
        return None

    async def _release(self, conn: psycopg.AsyncConnection, term: LeaseTerm) -> None:
        """Hand the shard over at once (token-conditional, so a newer holder is untouched)."""
        was_lost = term.lost_reason is not None
        with contextlib.suppress(psycopg.Error, OSError):
            if not conn.closed:
                released = await self._leases.release(conn, term)
                if released and not was_lost:
                    logger.info("released lease of shard %s", self.shard)

    # ----------------------------------------------------------------- active term

    async def _renew_loop(self, term: LeaseTerm, conn: psycopg.AsyncConnection) -> None:
        while term.lost_reason is None:
            await asyncio.sleep(self.config.lease_renew_interval)
            try:
                if not await self._leases.renew(conn, term):
                    logger.warning("lease renewal of shard %s failed", self.shard)
                    self.wake.set()
                    return
            except (psycopg.Error, OSError) as exc:
                # Not lost yet: the local trust deadline decides. Keep trying.
                logger.warning("lease renewal of shard %s errored: %s", self.shard, exc)
                if conn.closed or conn.broken:
                    self.wake.set()
                    return

    async def _active_term(
        self, term: LeaseTerm, lease_conn: psycopg.AsyncConnection, conn: psycopg.AsyncConnection
    ) -> None:
        renewer = asyncio.create_task(self._renew_loop(term, lease_conn))
        producer: RelayProducer | None = None
        failures = 0
        idle_wait = self._min_wait
        next_pause_check = 0.0
        paused = False
        next_retention = time.monotonic() + self.config.poll_interval
        prefetched: list[OutboxRecord] = []
        self._pending_mark = None
        self.active.set()
        self._metrics.lease_active.labels(self._label).set(1)
        self._metrics.lease_token.labels(self._label).set(term.token)
        logger.info("shard %s active with token %s", self.shard, term.token)
        try:
            while not self.stop.is_set():
                term.check()
                if renewer.done() and term.lost_reason is None:
                    raise PublishError("lease renewal connection failed")
                if not prefetched:
                    await self._settle_mark()
                if time.monotonic() >= next_pause_check:
                    await self._settle_mark()
                    paused = await self._store.paused(conn, self.config.relay_group)
                    term.check()
                    next_pause_check = time.monotonic() + self.config.poll_interval / 2
                if paused:
                    prefetched = []
                    await wait_any([self.stop], self.config.poll_interval / 2)
                    continue
                if producer is None:
                    prefetched = []
                    producer = await self._start_producer(term, conn)
                if prefetched:
                    batch, prefetched = prefetched, []
                else:
                    batch = await self._store.claim(conn, self.shard, self._limit)
                    term.check()
                if time.monotonic() >= next_retention:  # idle or not: tables stay bounded
                    await self._settle_mark()
                    await self._retention(term, conn)
                    next_retention = time.monotonic() + self.config.poll_interval * 5
                if not batch:
                    self.wake.clear()
                    await wait_any([self.wake, self.stop], idle_wait)
                    idle_wait = min(self.config.poll_interval, idle_wait * 2)
                    continue
                idle_wait = self._min_wait
                self._faults.reach("after_claim")
                try:
                    outcome, prefetched = await self._publish(term, conn, producer, batch)
                except ProducerFencedError as exc:
                    term.mark_lost(f"Kafka fenced our producer: {exc}")
                    raise LeaseLostError(str(exc), shard=self.shard) from exc
                except PublishError as exc:
                    logger.warning("shard %s: publishing failed: %s", self.shard, exc)
                    outcome, prefetched = Outcome.RETRY_LATER, []
                if outcome is Outcome.PUBLISHED:
                    failures = 0
                    continue
                await producer.close()
                producer = None
                if outcome is Outcome.RETRY_LATER:
                    failures += 1
                    self._metrics.failed.labels(self._label).inc()
                    delay = backoff_delay(
                        failures, self.config.backoff_initial, self.config.backoff_max, self._rng
                    )
                    await wait_any([self.stop], delay)
            # Stopping: the rows of the last Kafka commit are marked before the lease goes.
            await self._settle_mark()
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer
            pending, self._pending_mark = self._pending_mark, None
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pending
            if producer is not None:
                await producer.close()

    @property
    def _limit(self) -> int:
        return 1 if self._isolate_remaining > 0 else self.config.batch_size

    async def _settle_mark(self) -> None:
        """Wait for the database mark of the last committed batch (raises lease lost)."""
        pending, self._pending_mark = self._pending_mark, None
        if pending is not None:
            await pending

    async def _mark(self, term: LeaseTerm, conn: psycopg.AsyncConnection, ids: list[int]) -> None:
        await self._store.mark_published(
            conn, term, ids, delete=self.config.on_publish is OnPublish.DELETE
        )
        self._faults.reach("after_mark")

    @property
    def _min_wait(self) -> float:
        return min(self.config.poll_interval, 0.05)

    async def _start_producer(
        self, term: LeaseTerm, conn: psycopg.AsyncConnection
    ) -> RelayProducer:
        """A new producer life; in exactly-once mode, reconcile the last checkpoint first."""
        producer = self._producer_factory(self.shard)
        try:
            await producer.start()
            term.check()
            self._known_topics.clear()
            if self._checkpoints is not None:
                last = await self._checkpoints.last_committed(self.config.relay_group, self.shard)
                term.check()
                if last is not None:
                    changed = await self._store.reconcile(
                        conn, term, last.rows, delete=self.config.on_publish is OnPublish.DELETE
                    )
                    if changed:
                        logger.info(
                            "shard %s: reconciled %d row(s) committed to Kafka by token %s",
                            self.shard,
                            changed,
                            last.token,
                        )
                        self._metrics.published.labels(self._label).inc(changed)
        except ProducerFencedError as exc:
            await producer.close()
            term.mark_lost(f"Kafka fenced our producer: {exc}")
            raise LeaseLostError(str(exc), shard=self.shard) from exc
        except BaseException:
            await producer.close()
            raise
        return producer

    async def _topic_problem(self, producer: RelayProducer, topic: str) -> RecordError | None:
        if topic in self._known_topics:
            return None
        problem = await producer.topic_problem(topic)
        if problem is None:
            self._known_topics.add(topic)
        return problem

    async def _park(
        self, term: LeaseTerm, conn: psycopg.AsyncConnection, record: OutboxRecord, why: str
    ) -> None:
        await self._store.park(conn, term, record.id, why)
        self._metrics.parked.labels(self._label).inc()
        logger.warning(
            "shard %s: parked row %s (topic %s): %s", self.shard, record.id, record.topic, why
        )

    async def _park_unsendable(
        self,
        term: LeaseTerm,
        conn: psycopg.AsyncConnection,
        batch: list[OutboxRecord],
        problems: dict[str, RecordError],
        wait_behind_parked: bool,
    ) -> list[OutboxRecord]:
        """Park the rows whose topic cannot take records; the rest of the batch, in order."""
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

    async def _publish(
        self,
        term: LeaseTerm,
        conn: psycopg.AsyncConnection,
        producer: RelayProducer,
        batch: list[OutboxRecord],
    ) -> tuple[Outcome, list[OutboxRecord]]:
        """Send one batch (one Kafka transaction); returns the outcome and the next batch."""
        started = time.monotonic()
        wait_behind_parked = self.config.parked_key_policy is ParkedKeyPolicy.WAIT
        # Each topic is checked once per batch (and known-good topics not at all), not per row.
        problems: dict[str, RecordError] = {}
        for topic in {r.topic for r in batch} - self._known_topics:
            problem = await self._topic_problem(producer, topic)
            term.check()
            if problem is not None:
                problems[topic] = problem
        if problems:
            to_send = await self._park_unsendable(term, conn, batch, problems, wait_behind_parked)
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
                self.config.relay_group,
                self.shard,
                term.token,
                tuple((r.id, r.event_id) for r in to_send),
            )
            requests.append(self._checkpoints.request(checkpoint))
        # While Kafka takes this batch, the database side settles the previous batch's mark and
        # claims the next batch (excluding this one's rows): one batch in flight, order kept.
        in_flight = [r.id for r in batch]
        limit = self._limit
        previous_mark, self._pending_mark = self._pending_mark, None

        async def claim_next() -> list[OutboxRecord]:
            if previous_mark is not None:
                await previous_mark
            return await self._store.claim(conn, self.shard, limit, in_flight)

        next_batch = asyncio.create_task(claim_next())
        try:
            try:
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
                await producer.commit()
                term.check()
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
        conn: psycopg.AsyncConnection,
        producer: RelayProducer,
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

    async def _retention(self, term: LeaseTerm, conn: psycopg.AsyncConnection) -> None:
        keep = self.config.retention_seconds
        if keep is None or self.config.on_publish is OnPublish.DELETE:
            return
        total = 0
        while not self.stop.is_set():  # small batches, each its own short transaction
            deleted = await self._store.retention(conn, term, keep, self.config.retention_batch)
            term.check()
            total += deleted
            if deleted < self.config.retention_batch:
                break
        if total:
            logger.info("shard %s: retention removed %d published row(s)", self.shard, total)

    def describe(self) -> dict[str, object]:
        return {
            "shard": self.shard,
            "active": self.active.is_set(),
            "token": self.term.token if self.term else None,
            "mode": self.config.mode.value,
            "uses_checkpoint": self.config.mode is Mode.EXACTLY_ONCE,
        }
