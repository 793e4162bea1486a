"""The relay process: one worker per shard it watches, a LISTEN hint, metrics and sampling.

A relay may start before its database or broker (a standby on a node that came up first, a
PostgreSQL restart): start-up waits with back-off, saying what it waits for, instead of exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import uuid
from collections.abc import Callable

import psycopg

from outboxkit import db
from outboxkit.db import migrator
from outboxkit.db.connect import refused
from outboxkit.errors import ConfigurationError, PublishError
from outboxkit.faults import FaultPoints
from outboxkit.kafka import KafkaClients
from outboxkit.kafka.api import TransactionalProducer, transactional_id
from outboxkit.kafka.errors import with_credentials_hint
from outboxkit.log_limit import LimitedLines, normalised
from outboxkit.relay.checkpoint import CheckpointTopic
from outboxkit.relay.connections import ProcessLeases
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.notify import listen_forever
from outboxkit.relay.open_files import check_open_files
from outboxkit.relay.retry_log import SHOWN_IN_FULL
from outboxkit.relay.shard_worker import ShardWorker
from outboxkit.relay.status_sampler import sample_forever
from outboxkit.relay.waiting import backoff_delay, finished_unless, wait_any
from outboxkit.settings import Mode, Settings

logger = logging.getLogger("outboxkit.relay.runner")


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def slot_transactional_id(group: str, shard: int, slot: int) -> str:
    """Slot 0 keeps the single-producer id (its zombie is fenced after an upgrade)."""
    base = transactional_id(group, shard)
    return base if slot == 0 else f"{base}.{slot}"


def make_producer_factory(
    settings: Settings, kafka: KafkaClients
) -> Callable[[int, int], TransactionalProducer]:
    config = settings.relay

    def factory(shard: int, slot: int) -> TransactionalProducer:
        exactly_once = config.mode is Mode.EXACTLY_ONCE
        txn_id = slot_transactional_id(config.group, shard, slot) if exactly_once else None
        # The client's queue holds at most about one claim (bytes), so memory follows settings.
        return kafka.transactional_producer(txn_id, max_queue_bytes=config.max_batch_bytes)

    return factory


def _listed(shards: list[int]) -> str:
    return ", ".join(map(str, shards))


class Relay:
    """Run with ``await Relay(settings).run()``; ``stop`` (an event) ends it cleanly."""

    def __init__(
        self,
        settings: Settings,
        *,
        holder: str | None = None,
        metrics: RelayMetrics | None = None,
        faults: FaultPoints | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.settings = settings
        self.config = settings.relay
        self.database_url = settings.database_url  # raises if unset or ambiguous: before anything
        self.kafka = KafkaClients(settings.kafka, timeout=self.config.kafka_timeout)
        self.holder = holder or default_holder()
        self.metrics = metrics or RelayMetrics()
        self.faults = faults or FaultPoints()
        self.stop = stop or asyncio.Event()
        self.workers: dict[int, ShardWorker] = {}
        self.leases: ProcessLeases | None = None  # set when the workers start
        self.ready = asyncio.Event()
        # Every connection of the process: a stop that the database does not answer still
        # ends, as statements still waiting STATEMENT_GRACE_SECONDS after it are ended.
        self.connections = db.OpenConnections()
        self.startup_waits = 0  # start-up attempts that found PostgreSQL or Kafka unavailable
        self.outbox = ""  # the outbox's identity, for its checkpoints (read at start-up)

    def _check_schema(self) -> int:
        """Schema check, shard count and the outbox's identity, on one connection of our own
        (blocking)."""
        schema = self.settings.schema_name
        with db.connect(
            self.database_url,
            **db.connect_timeout(self.database_url),
            track=self.connections,
        ) as conn:
            migrator.require_current(conn, schema)
            row = db.one(conn, db.query("relay", "shard_count", schema))
            identity = db.one(conn, db.query("relay", "outbox_identity", schema))
        assert row is not None
        assert identity is not None  # the one settings row, with its id since 0006
        self.outbox = str(identity[0])
        return int(row[0])

    async def _shards(self) -> list[int]:
        """The shards to watch. Asked-for shards beyond the count are left out with a warning
        (``relay shards N`` may have lowered it under a running deployment, whose other shards
        still need their relay); none left is an error, not a relay that watches nothing."""
        count = await asyncio.to_thread(self._check_schema)
        if self.config.shards is None:
            return list(range(count))
        kept = [s for s in self.config.shards if s < count]
        dropped = sorted({s for s in self.config.shards if s >= count})
        if not kept:
            raise ConfigurationError(
                f"none of the shards asked for ({_listed(dropped)}) exists: the shard count is"
                f" {count}, so shards are 0..{count - 1} (OUTBOXKIT_RELAY_SHARDS, [relay] shards"
                " or --shards)"
            )
        if dropped:
            logger.warning(
                "relay %s: shards %s do not exist (the shard count is %d, shards are 0..%d):"
                " watching %s only",
                self.holder,
                _listed(dropped),
                count,
                count - 1,
                _listed(kept),
            )
        return kept

    async def _checkpoints(self, shards: list[int]) -> CheckpointTopic | None:
        if self.config.mode is not Mode.EXACTLY_ONCE:
            return None
        checkpoints = CheckpointTopic(self.kafka, self.config.checkpoint_topic, self.outbox)
        await checkpoints.ensure(max(shards, default=0) + 1)
        return checkpoints

    async def _start_up(self) -> tuple[list[int], CheckpointTopic | None] | None:
        """Shards and checkpoint topic, waiting out an unavailable database or broker."""
        rng = random.Random()
        # A long outage: the first attempts' lines (the back-off growing), then one a minute.
        said = LimitedLines(logger, shown_in_full=SHOWN_IN_FULL)
        while not self.stop.is_set():
            try:
                shards = await self._shards()
                # Cut short by a stop: a broker that refuses our login answers only at the timeout.
                checkpoints = asyncio.ensure_future(self._checkpoints(shards))
                if not await finished_unless(checkpoints, self.stop):
                    return None
                said.answered()
                said.end(logging.INFO, "PostgreSQL and Kafka answer after %.1f s of waiting")
                return shards, checkpoints.result()
            except psycopg.ProgrammingError as exc:  # a malformed URL, missing grants
                raise refused(exc, self.database_url) from None
            except (psycopg.OperationalError, OSError) as exc:
                url = self.database_url
                what = f"PostgreSQL at {db.redact(url.get_secret_value(), url)}"
                problem = db.redact(str(exc).strip(), url)
            except PublishError as exc:
                what = f"Kafka at {self.settings.kafka.bootstrap}"
                problem = with_credentials_hint(str(exc))
            self.startup_waits += 1
            delay = backoff_delay(
                self.startup_waits, self.config.backoff_initial, self.config.backoff_max, rng
            )
            first = problem.splitlines()[0] if problem else "unavailable"
            said.log(
                logging.WARNING,
                normalised(f"{what}: {first}"),
                "relay %s: waiting for %s (%s); retrying in %.1fs",
                self.holder,
                what,
                first,
                delay,
            )
            await wait_any([self.stop], delay)
        return None

    async def run(self) -> None:
        server = None
        if self.config.metrics_port is not None:
            server = self.metrics.serve(self.config.metrics_port, self.config.metrics_host)
        try:
            answers = db.answers(self.database_url, **self.settings.database.connect_options())
            with db.StopWatchdog(self.connections, self.stop.is_set, answers):
                started = await self._start_up()
                if started is not None:
                    await self._run(*started)
        finally:
            if server is not None:
                server.shutdown()
                server.server_close()

    async def _run(self, shards: list[int], checkpoints: CheckpointTopic | None) -> None:
        factory = make_producer_factory(self.settings, self.kafka)
        # Two connections for the leases of every shard of this process (attempts; renewals).
        leases = ProcessLeases(self.settings, connections=self.connections)
        self.leases = leases
        for shard in shards:
            self.workers[shard] = ShardWorker(
                self.settings,
                shard,
                holder=self.holder,
                stop=self.stop,
                producer_factory=factory,
                checkpoints=checkpoints,
                metrics=self.metrics,
                faults=self.faults,
                leases=leases,
            )
        cap = self.config.max_shards_per_process
        held = len(shards) if cap is None else min(cap, len(shards))
        exactly_once = self.config.mode is Mode.EXACTLY_ONCE
        check_open_files(held, self.config.producers_per_shard if exactly_once else 1)
        logger.info(
            "relay %s starting: shards %s (holding at most %s), Kafka client %s, settings %s",
            self.holder,
            shards,
            "all" if cap is None else cap,
            self.kafka.client.value,
            self.settings.redacted(),
        )
        tasks = [asyncio.create_task(w.run(), name=f"shard-{s}") for s, w in self.workers.items()]
        every = max(1.0, self.config.poll_interval * 2)
        helpers = [
            asyncio.create_task(
                sample_forever(
                    self.database_url,
                    self.settings.schema_name,
                    self.config.group,
                    self.holder,
                    self.metrics,
                    self.stop,
                    every=every,
                    connect_options=self.settings.database.connect_options(),
                    # A lease outlives a missed sample or two; past this, holders may be gone.
                    stale_after=max(self.config.lease_ttl, 3 * every),
                    track=leases.connections,
                )
            )
        ]
        if self.config.listen:
            helpers.append(
                asyncio.create_task(
                    listen_forever(
                        self.database_url,
                        self.settings.schema_name,
                        self._wake,
                        self.stop,
                        track=leases.connections,
                    )
                )
            )
        self.ready.set()
        try:
            await asyncio.gather(*tasks)
        finally:
            self.stop.set()
            for task in tasks + helpers:
                task.cancel()
            for task in tasks + helpers:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await leases.close()
            logger.info("relay %s stopped", self.holder)

    def _wake(self, shard: int | None) -> None:
        worker = self.workers.get(shard) if shard is not None else None
        if worker is not None:
            worker.notifications += 1
            worker.wake.set()
        elif shard is None:
            for each in self.workers.values():
                each.wake.set()
