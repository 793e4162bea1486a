"""What a verify run is made of: its settings, where it runs, its names, and their set-up.

Each run has its own names (topics, relay group, consumer names, checkpoint topic) derived from
the seed and a random suffix, so runs never see each other's data even on a shared deployment.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from outboxkit import db
from outboxkit.db import migrator
from outboxkit.devstack import DevStack
from outboxkit.kafka import KafkaClients
from outboxkit.settings import KafkaSettings
from outboxkit.verify.workload import DDL, SCHEMA

CLIENTS = ("confluent", "aiokafka")


@dataclass(frozen=True)
class RunConfig:
    seed: int
    duration: float
    workdir: Path
    writers: int = 3
    relays: int = 2
    consumers: int = 4
    rate: float = 10.0  # write attempts per second per writer
    partitions: int = 4
    shards: int = 4
    keys: int = 16
    drain_timeout: float = 180.0


@dataclass
class Target:
    """Where the run goes: URLs for this process, variables for the children."""

    database_url: str
    kafka: KafkaSettings
    env: dict[str, str]
    schema: str = SCHEMA
    stack: DevStack | None = None  # the self-started stack, when there is one

    @property
    def self_started(self) -> str:
        if self.stack is None:
            return "external"
        servers = (("postgresql", self.stack.postgres), ("kafka", self.stack.kafka))
        started = [name for name, server in servers if server is not None]
        return "self-started" if len(started) == 2 else f"self-started {'+'.join(started)}"


@dataclass
class Names:
    run_id: str
    topics: list[str] = field(default_factory=list)
    relay_group: str = ""
    checkpoint: str = ""
    consumers: list[str] = field(default_factory=list)

    @classmethod
    def for_run(cls, seed: int) -> Names:
        run_id = f"{seed}-{uuid.uuid4().hex[:6]}"
        return cls(
            run_id=run_id,
            topics=[f"outboxkit.verify.{run_id}.{n}" for n in ("orders", "payments")],
            relay_group=f"verify-{run_id}",
            checkpoint=f"outboxkit.verify.{run_id}.checkpoint",
            consumers=[f"verify-{run_id}-{client}" for client in CLIENTS],
        )


def with_app_name(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


def setup(config: RunConfig, target: Target, names: Names) -> None:
    migrator.upgrade(target.database_url, target.schema)
    with db.connect(target.database_url) as conn:
        for statement in DDL:
            conn.execute(statement)
        # The run's own schema: several shards, so relays share the work and take over.
        conn.execute(
            f"UPDATE {target.schema}.outbox_setting SET shard_count = %s", (config.shards,)
        )

    async def topics() -> None:
        admin = KafkaClients(target.kafka).admin()
        try:
            for topic in names.topics:
                await admin.create_topic(topic, config.partitions, {})
                await admin.create_topic(f"{topic}.dlq", 1, {})
        finally:
            await admin.close()

    asyncio.run(topics())
