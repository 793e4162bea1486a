"""The relay process: one worker per shard it watches, a LISTEN hint, metrics and sampling."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable

import psycopg

from outboxkit import migrator
from outboxkit.queries import query
from outboxkit.relay.checkpoint import CheckpointTopic
from outboxkit.relay.config import Mode, ProducerBackend, RelayConfig
from outboxkit.relay.faults import FaultPoints
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.notify import listen_forever
from outboxkit.relay.producer.base import RelayProducer, transactional_id
from outboxkit.relay.shard_worker import ShardWorker, wait_any

logger = logging.getLogger("outboxkit.relay.runner")


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def make_producer_factory(config: RelayConfig) -> Callable[[int], RelayProducer]:
    def factory(shard: int) -> RelayProducer:
        txn_id = (
            transactional_id(config.relay_group, shard)
            if config.mode is Mode.EXACTLY_ONCE
            else None
        )
        if config.producer is ProducerBackend.AIOKAFKA:
            from outboxkit.relay.producer.aiokafka import AiokafkaProducer

            return AiokafkaProducer(
                config.kafka_bootstrap,
                transactional_id=txn_id,
                timeout=config.kafka_timeout,
                options=dict(config.producer_options),
            )
        from outboxkit.relay.producer.confluent import ConfluentProducer

        return ConfluentProducer(
            config.kafka_bootstrap,
            transactional_id=txn_id,
            timeout=config.kafka_timeout,
            options=dict(config.producer_options),
        )

    return factory


class Relay:
    """Run with ``await Relay(config).run()``; ``stop`` (an event) ends it cleanly."""

    def __init__(
        self,
        config: RelayConfig,
        *,
        holder: str | None = None,
        metrics: RelayMetrics | None = None,
        faults: FaultPoints | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.config = config
        self.holder = holder or default_holder()
        self.metrics = metrics or RelayMetrics()
        self.faults = faults or FaultPoints()
        self.stop = stop or asyncio.Event()
        self.workers: dict[int, ShardWorker] = {}
        self.ready = asyncio.Event()

    async def _shards(self) -> list[int]:
        url = self.config.database_url.get_secret_value()
        await asyncio.to_thread(migrator.require_current, url, self.config.schema_name)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            cur = await conn.execute(query("relay", "shard_count", self.config.schema_name))
            row = await cur.fetchone()
        assert row is not None
        count = int(row[0])
        if self.config.owned_shards is None:
            return list(range(count))
        return [s for s in self.config.owned_shards if s < count]

    async def run(self) -> None:
        shards = await self._shards()
        checkpoints = None
        if self.config.mode is Mode.EXACTLY_ONCE:
            checkpoints = CheckpointTopic(
                self.config.kafka_bootstrap,
                self.config.checkpoint_topic,
                timeout=self.config.kafka_timeout,
            )
            await checkpoints.ensure(max(shards, default=0) + 1)
        factory = make_producer_factory(self.config)
        for shard in shards:
            self.workers[shard] = ShardWorker(
                self.config,
                shard,
                holder=self.holder,
                stop=self.stop,
                producer_factory=factory,
                checkpoints=checkpoints,
                metrics=self.metrics,
                faults=self.faults,
            )
        logger.info(
            "relay %s starting: shards %s, settings %s",
            self.holder,
            shards,
            self.config.safe_summary(),
        )
        server = None
        if self.config.metrics_port is not None:
            server = self.metrics.serve(self.config.metrics_port)
        tasks = [asyncio.create_task(w.run(), name=f"shard-{s}") for s, w in self.workers.items()]
        helpers = [asyncio.create_task(self._sample_forever())]
        if self.config.listen:
            helpers.append(
                asyncio.create_task(
                    listen_forever(
                        self.config.database_url.get_secret_value(),
                        self.config.schema_name,
                        self._wake,
                        self.stop,
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
            if server is not None:
                server.shutdown()
                server.server_close()
            logger.info("relay %s stopped", self.holder)

    def _wake(self, shard: int | None) -> None:
        worker = self.workers.get(shard) if shard is not None else None
        if worker is not None:
            worker.notifications += 1
            worker.wake.set()
        elif shard is None:
            for each in self.workers.values():
                each.wake.set()

    async def _sample_forever(self) -> None:
        """Backlog, oldest pending age, parked rows, group holders: for metrics and /healthz."""
        url = self.config.database_url.get_secret_value()
        while not self.stop.is_set():
            try:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                    while not self.stop.is_set():
                        cur = await conn.execute(
                            query("relay", "status", self.config.schema_name),
                            {"group": self.config.relay_group},
                        )
                        for row in await cur.fetchall():
                            label = str(row[0])
                            self.metrics.group_active.labels(label).set(1 if row[4] else 0)
                            self.metrics.backlog.labels(label).set(row[5])
                            self.metrics.oldest_pending.labels(label).set(float(row[6] or 0))
                            self.metrics.parked_rows.labels(label).set(row[7])
                        await wait_any([self.stop], max(1.0, self.config.poll_interval * 2))
            except (psycopg.Error, OSError) as exc:
                logger.info("status sampling failed: %s", exc)
                await wait_any([self.stop], 2.0)
