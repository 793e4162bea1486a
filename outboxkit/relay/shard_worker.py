"""One shard's loop: standby -> acquire lease -> (re)create producer -> reconcile -> publish.

Active term, per batch (see ``publisher``): claim pending rows -> produce (+ checkpoint) in one
Kafka transaction -> commit -> mark published (or delete), conditional on the token. After every
await the worker checks that it still holds its lease; *lease lost* (a failed token check, a
lapsed trust deadline, Kafka fencing our producer) is its own outcome: stop at once, publish and
mark nothing more, count and log it, back to standby. Never a retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import psycopg

from outboxkit import db
from outboxkit.db.availability import with_pooler_hint
from outboxkit.errors import ConfigurationError, LeaseLostError, ProducerFencedError, PublishError
from outboxkit.faults import FaultPoints
from outboxkit.kafka.api import TransactionalProducer
from outboxkit.kafka.errors import with_acl_hint
from outboxkit.relay.checkpoint import CheckpointTopic
from outboxkit.relay.connections import ProcessLeases
from outboxkit.relay.housekeeping import Housekeeping
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.lease_loss import LeaseLoss, blame_jump
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.publisher import BatchPublisher, Outcome
from outboxkit.relay.reader import OutboxRecord, ShardStore
from outboxkit.relay.retry_log import SHOWN_IN_FULL, RetryLog
from outboxkit.relay.scheduling import Scheduling
from outboxkit.relay.takeover import fence_slots, reconcile
from outboxkit.relay.waiting import backoff_delay, finished_unless, wait_any
from outboxkit.settings import Mode, OnPublish, ParkedKeyPolicy, Settings

logger = logging.getLogger("outboxkit.relay.shard_worker")

ProducerFactory = Callable[[int, int], TransactionalProducer]  # (shard, slot)
Conn = psycopg.AsyncConnection[Any]

__all__ = ["Outcome", "ShardWorker", "backoff_delay", "wait_any"]


class ShardWorker:
    def __init__(
        self,
        settings: Settings,
        shard: int,
        *,
        holder: str,
        stop: asyncio.Event,
        producer_factory: ProducerFactory,
        checkpoints: CheckpointTopic | None,
        metrics: RelayMetrics,
        faults: FaultPoints,
        leases: ProcessLeases | None = None,
    ) -> None:
        self.config = settings.relay
        self._database_url = settings.database_url
        self._connect_options = settings.database.connect_options()
        self.shard = shard
        self.holder = holder
        self.stop = stop
        self.wake = asyncio.Event()
        self.active = asyncio.Event()  # set while this worker holds a trusted term (tests wait)
        self.term: LeaseTerm | None = None
        self.lease_lost_count = 0
        self.notifications = 0  # NOTIFY hints addressed to this shard (observability, tests)
        self.paused = False  # the group's pause flag as this worker last read it (tests wait)
        self._producer_factory = producer_factory
        self._built = False  # whether this worker's producers ever started
        self._checkpoints = checkpoints
        self._metrics = metrics
        # Lease attempts, renewals and releases: on the process's shared connections.
        self._leases = leases or ProcessLeases(settings)
        self._owns_leases = leases is None  # then this worker closes them when it ends
        self._store = ShardStore(
            settings.schema_name,
            skip_parked_keys=self.config.parked_key_policy is ParkedKeyPolicy.SKIP,
            max_bytes=self.config.max_batch_bytes,
        )
        self._publisher = BatchPublisher(
            self.config,
            shard,
            store=self._store,
            checkpoints=checkpoints,
            metrics=metrics,
            faults=faults,
            stop=stop,
        )
        self._faults = faults
        self._rng = random.Random()
        self._label = str(shard)
        self._retry_log = RetryLog(logger, shard)
        parked = metrics.parked.labels(self._label)
        self.housekeeping = Housekeeping(
            self.config, settings.schema_name, on_parked=lambda count: parked.inc(count)
        )
        self.scheduling = Scheduling.of(self.config)
        for counter in (metrics.published, metrics.failed, metrics.parked):
            counter.labels(self._label)  # every series exists from the start, at 0
        for cause in LeaseLoss:
            metrics.lease_lost.labels(self._label, cause)
        metrics.lease_active.labels(self._label).set(0)

    # ----------------------------------------------------------------- outer loop (standby)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self._retry_log.standby()  # counts still pending are shown, not lost
            if self._owns_leases:
                await self._leases.close()

    async def _run(self) -> None:
        failures = 0  # failed sessions, and terms lost unpublished, since a term worked
        while not self.stop.is_set():
            marks = self._publisher.stats.marks
            delay = 0.0
            try:
                await self._one_session()
                failures = 0
            except (LeaseLostError, ProducerFencedError) as exc:
                cause = (
                    LeaseLoss.FENCED
                    if isinstance(exc, ProducerFencedError)
                    else exc.context.get("cause", LeaseLoss.UNKNOWN)
                )
                self.lease_lost_count += 1
                self._retry_log.standby()
                self._metrics.lease_lost.labels(self._label, cause).inc()
                # A term whose mark committed: back to standby at once (a successor may be ready).
                # One lost before that backs off like a failure (else a spin through attempts).
                if self._publisher.stats.marks > marks:
                    failures = 0
                else:
                    failures += 1
                    delay = self._backoff(failures)
                logger.warning(
                    "lease lost on shard %s (%s): %s; back to standby%s",
                    self.shard,
                    cause,
                    exc,
                    f" in {delay:.2f}s" if delay else "",
                    extra={"shard": self.shard, "reason": str(cause)},
                )
            except Exception as exc:  # a worker must never die silently: log, back off, retry
                if isinstance(exc, ConfigurationError) and not self._built:
                    # Settings that never built a client: every shard fails alike, waiting
                    # cannot fix it. Later (a certificate file briefly gone while it is
                    # rotated) it is retried like any failure.
                    self.stop.set()
                    raise
                if self.stop.is_set() and isinstance(exc, psycopg.OperationalError | OSError):
                    logger.info("shard %s stopped: %s: %s", self.shard, type(exc).__name__, exc)
                    continue  # a statement the stop ended (outboxkit.db.abandon): no retry
                if self._publisher.stats.marks > marks and self.term is not None:
                    self._retry_log.recovered(self.term.token)  # a mark committed, then this
                failures = 1 if self._retry_log.worked else failures + 1
                expected = psycopg.Error | OSError | PublishError | ConfigurationError
                if not isinstance(exc, expected) and self._retry_log.attempts < SHOWN_IN_FULL:
                    logger.exception("shard %s: unexpected error", self.shard)
                delay = self._backoff(failures)
                text = with_pooler_hint(with_acl_hint(str(exc)), exc)
                self._retry_log.retrying(type(exc).__name__, text, delay)
            finally:
                self.active.clear()
                self._metrics.lease_active.labels(self._label).set(0)
                self._metrics.lease_token.labels(self._label).set(0)  # no term, no token
            if delay:
                await wait_any([self.stop], delay)

    def _backoff(self, failures: int) -> float:
        return backoff_delay(
            failures, self.config.backoff_initial, self.config.backoff_max, self._rng
        )

    def _connect(self) -> contextlib.AbstractAsyncContextManager[Conn]:
        return db.connection_async(
            self._database_url,
            application_name=f"outboxkit-relay-{self.shard}",
            **db.connect_timeout(self._database_url),
            track=self._leases.connections,
            **self._connect_options,
        )

    async def _one_session(self) -> None:
        term = await self._wait_for_lease()
        if term is None:
            return
        self.term = term  # only now does the shard hold a data connection (renewal is shared)
        try:
            async with self._connect() as data_conn:
                await self._active_term(term, data_conn)
        finally:
            await self._leases.release(term, level=self._retry_log.term_level)  # at once

    async def _wait_for_lease(self) -> LeaseTerm | None:
        while not self.stop.is_set():
            term = await self._leases.acquire(
                self.config.group,
                self.shard,
                self.holder,
                self.config.lease_ttl,
                self.wake,
                level=self._retry_log.term_level,
            )
            if term is not None:
                return term
            self._retry_log.standby()  # held elsewhere: this process's streak is over
            await wait_any([self.stop], self.config.poll_interval)
        return None

    # ----------------------------------------------------------------- active term

    async def _active_term(self, term: LeaseTerm, conn: Conn) -> None:
        renewer = asyncio.create_task(self._leases.watch(term))  # renewed by the process
        producers: list[TransactionalProducer] | None = None
        turn = 0  # the slot whose transaction comes next; the slots commit strictly in turn
        publisher = self._publisher
        failures = 0
        idle_wait = self._min_wait
        next_pause_check = 0.0
        next_retention = time.monotonic() + self.config.poll_interval
        prefetched: list[OutboxRecord] = []
        marks = publisher.stats.marks
        self.active.set()
        self._metrics.lease_active.labels(self._label).set(1)
        self._metrics.lease_token.labels(self._label).set(term.token)
        level = self._retry_log.term_level
        logger.log(level, "shard %s active with token %s", self.shard, term.token)
        try:
            await publisher.pay_owed_marks(term, conn)  # before anything is sent again
            while not self.stop.is_set():
                term.check()
                if publisher.stats.marks > marks:  # not a Kafka commit: its mark may fail
                    self._retry_log.recovered(term.token)
                if renewer.done() and term.lost_reason is None:
                    raise PublishError("lease renewal connection failed")
                prefetched = [] if self.scheduling.due() else prefetched  # the pass goes first
                if not prefetched:
                    await publisher.settle_mark()
                if time.monotonic() >= next_pause_check:
                    await publisher.settle_mark()
                    self.paused = await self._store.paused(conn, self.config.group)
                    term.check()
                    next_pause_check = time.monotonic() + self.config.poll_interval / 2
                if self.paused:
                    prefetched = []
                    await wait_any([self.stop], self.config.poll_interval / 2)
                    continue
                if producers is None:
                    prefetched = []
                    producers, turn = await self._start_producers(term, conn), 0
                    if producers is None:
                        continue  # stopped while a producer started
                if prefetched:
                    batch, prefetched = prefetched, []
                else:
                    await self.scheduling.run_if_due(conn, term, self._store, self.stop)
                    # Cleared before the claim: a hint for rows committed while it runs (too late
                    # for it) keeps the event set, so the wait below ends at once.
                    self.wake.clear()
                    batch = await publisher.claim(conn)
                    term.check()
                if time.monotonic() >= next_retention:  # idle or not: tables stay bounded
                    await publisher.settle_mark()
                    await self._retention(term, conn)
                    self._retry_log.recovered(term.token)  # a whole pass: the term works
                    behind = self.housekeeping.retention_behind  # then again after one batch
                    pause = 0.0 if behind else self.config.poll_interval * 5
                    next_retention = time.monotonic() + pause
                if not batch:  # idle: behind on retention, only the shortest wait
                    behind = self.housekeeping.retention_behind
                    await wait_any([self.wake, self.stop], self._min_wait if behind else idle_wait)
                    idle_wait = min(self.config.poll_interval, idle_wait * 2)
                    continue
                idle_wait = self._min_wait
                self._faults.reach("after_claim")
                try:
                    outcome, prefetched = await publisher.publish(
                        term, conn, producers[turn], batch, turn
                    )
                except ProducerFencedError as exc:
                    raise self._fenced(term, exc) from exc
                except PublishError as exc:
                    logger.warning("shard %s: publishing failed: %s", self.shard, exc)
                    outcome, prefetched = Outcome.RETRY_LATER, []
                if outcome is Outcome.PUBLISHED:
                    failures = 0
                    turn = (turn + 1) % len(producers)
                    continue
                await self._close_all(producers)
                producers = None
                if outcome is Outcome.RETRY_LATER:
                    failures += 1
                    self._metrics.failed.labels(self._label).inc()
                    await wait_any([self.stop], self._backoff(failures))
            # Stopping: the rows of the last Kafka commit are marked before the lease goes.
            await publisher.settle_mark()
        finally:
            summary = publisher.stats.summary()
            level = self._retry_log.term_level
            logger.log(level, "shard %s term ended; publishing so far: %s", self.shard, summary)
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer
            await publisher.abandon_mark()
            if producers is not None:
                await self._close_all(producers)

    def _fenced(self, term: LeaseTerm, exc: ProducerFencedError) -> LeaseLostError:
        """A term already lost keeps its first reason (the renewer may have seen the takeover
        before Kafka's refusal arrived); a fenced one after a pause counts as a clock jump."""
        cause, why = blame_jump(term, LeaseLoss.FENCED, f"Kafka fenced our producer ({exc})")
        term.mark_lost(why, cause)
        return LeaseLostError(
            f"lease of shard {self.shard} lost: {term.lost_reason}",
            shard=self.shard,
            token=term.token,
            cause=term.lost_cause,
        )

    @property
    def _min_wait(self) -> float:
        return min(self.config.poll_interval, 0.05)

    @staticmethod
    async def _close_all(producers: list[TransactionalProducer]) -> None:
        for producer in producers:
            await producer.close()

    async def _start_producers(
        self, term: LeaseTerm, conn: Conn
    ) -> list[TransactionalProducer] | None:
        """A new producer life for every slot; in exactly-once mode, reconcile first.

        Every slot's ``init_transactions`` runs before any checkpoint is read: each fences its
        zombie and settles (aborts) the open transaction of its id, so what is read next is all
        that was committed and nothing can commit behind our back. A stop cuts a start short
        (None): nothing was sent in this life, so the lease can go at once.
        """
        slots = self.config.producers_per_shard if self._checkpoints is not None else 1
        producers: list[TransactionalProducer] = []
        try:
            # Raised to our own count before any slot is used: up to it, a takeover fences.
            fence_up_to = slots
            if self._checkpoints is not None:
                fence_up_to = await self._store.raise_producer_slots(conn, term, slots)
            for slot in range(slots):
                producers.append(self._producer_factory(self.shard, slot))
                if not await finished_unless(
                    asyncio.ensure_future(producers[-1].start()), self.stop
                ):
                    await self._close_all(producers)
                    return None
                term.check()
            self._built = True
            self._publisher.new_producer_life()
            if self._checkpoints is not None:
                check = self._checkpoints.check_writable(producers[0], (self.shard, term.token))
                retired = range(slots, fence_up_to)  # an earlier holder's: fenced too
                if not await finished_unless(asyncio.ensure_future(check), self.stop) or (
                    retired
                    and not await fence_slots(self._producer_factory, term, retired, self.stop)
                ):
                    await self._close_all(producers)
                    return None
                delete = self.config.on_publish is OnPublish.DELETE
                changed = await reconcile(self._store, conn, term, self._checkpoints, delete=delete)
                self._metrics.published.labels(self._label).inc(changed)
                if retired:
                    await self._store.record_producer_slots(conn, term, slots)
        except ProducerFencedError as exc:
            await self._close_all(producers)
            raise self._fenced(term, exc) from exc
        except BaseException:
            await self._close_all(producers)
            raise
        return producers

    async def _retention(self, term: LeaseTerm, conn: Conn) -> None:
        await self.housekeeping.run_if_due(conn, term, self.stop)
        await self.housekeeping.retain_published(conn, term, self._store, self.stop)

    def describe(self) -> dict[str, object]:
        return {
            "shard": self.shard,
            "active": self.active.is_set(),
            "token": self.term.token if self.term else None,
            "mode": self.config.mode.value,
            "uses_checkpoint": self.config.mode is Mode.EXACTLY_ONCE,
        }
