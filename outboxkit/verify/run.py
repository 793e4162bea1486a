"""One ``outboxkit verify`` run: start writers, relays and consumers, run the nemesis, drain,
read everything back and check it. The clock starts once the processes are up."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from outboxkit import db
from outboxkit.errors import OutboxkitError
from outboxkit.verify import collect
from outboxkit.verify.checker import Report, check
from outboxkit.verify.history import ConsumerSpec, History, RunParams, TopicSpec
from outboxkit.verify.layout import CLIENTS, Names, RunConfig, Target, setup, with_app_name
from outboxkit.verify.nemesis import Nemesis
from outboxkit.verify.observe import TokenSampler
from outboxkit.verify.procs import Child, Fleet, python_module
from outboxkit.verify.target import DATABASE_ENV

Echo = Callable[[str], None]
_SESSION = {  # a killed consumer leaves its group in 6 s, not 45 s
    "confluent": ("session.timeout.ms=6000", "heartbeat.interval.ms=1000"),
    "aiokafka": ("session_timeout_ms=6000", "heartbeat_interval_ms=1000"),
}


class VerifyError(OutboxkitError):
    """The run could not be carried out (not: the run found an anomaly)."""


class Run:
    def __init__(self, config: RunConfig, target: Target, echo: Echo) -> None:
        self.config = config
        self.target = target
        self.echo = echo
        self.names = Names.for_run(config.seed)
        self.fleet = Fleet()
        self.prefix = f"okv-{self.names.run_id}"
        self.t0_wall = time.time()
        self.t0 = time.monotonic()
        self.base_env = {k: v for k, v in os.environ.items() if k != "OUTBOXKIT_FAULT"}
        self.base_env |= target.env | {"OUTBOXKIT_SCHEMA": target.schema}
        self.problems: list[str] = []  # the run itself went wrong: a failure, not an anomaly
        self.notes: list[str] = []
        self.drain_seconds = 0.0

    def _child(self, name: str, role: str, argv: list[str], env: dict[str, str]) -> Child:
        log = self.config.workdir / f"{name}.log"
        return Child(name=name, role=role, argv=argv, env={**self.base_env, **env}, log=log)

    def _relay(self, index: int) -> Child:
        env = {
            "OUTBOXKIT_KAFKA_CLIENT": CLIENTS[index % 2],
            "OUTBOXKIT_RELAY_GROUP": self.names.relay_group,
            "OUTBOXKIT_RELAY_MODE": "exactly_once",
            "OUTBOXKIT_RELAY_LEASE_TTL": "3",
            "OUTBOXKIT_RELAY_POLL_INTERVAL": "0.5",
            "OUTBOXKIT_RELAY_BACKOFF_MAX": "1",
            "OUTBOXKIT_RELAY_KAFKA_TIMEOUT": "15",
            "OUTBOXKIT_RELAY_CHECKPOINT_TOPIC": self.names.checkpoint,
        }
        argv = python_module("outboxkit.relay", "run")
        return self._child(f"relay-{index}", "relay", argv, env)

    def _consumer(self, index: int, role: str = "consumer") -> Child:
        client = CLIENTS[index % 2]
        name = self.names.consumers[index % 2]
        env = {
            "OUTBOXKIT_DATABASE_URL": with_app_name(
                self.target.database_url, f"{self.prefix}-c{index}"
            ),
            "OUTBOXKIT_CONSUMER_NAME": name,
            "OUTBOXKIT_CONSUMER_GROUP": name,
            "OUTBOXKIT_CONSUMER_TOPICS": ",".join(self.names.topics),
            "OUTBOXKIT_CONSUMER_LEASE_SECONDS": "5",
            "OUTBOXKIT_CONSUMER_MAX_ATTEMPTS": "50",
            "OUTBOXKIT_CONSUMER_RETRY_DELAY": "0.2",
            "OUTBOXKIT_CONSUMER_DEAD_LETTER_CHECK": "warn",
            "OUTBOXKIT_CONSUMER_RETENTION_WINDOW": "0",
        }
        registry = "SYNC" if client == "confluent" else "ASYNC"
        argv = python_module("outboxkit.inbox.worker", "--adapter", client)
        argv += ["--registry", f"outboxkit.verify.workload:{registry}"]
        for option in _SESSION[client]:
            argv += ["--kafka-option", option]
        label = "extra" if role != "consumer" else "consumer"
        return self._child(f"{label}-{index}-{client}", role, argv, env)

    def _writer(self, index: int) -> Child:
        argv = python_module(  # the URL goes in the environment: a command line is public
            "outboxkit.verify.writer",
            "--index",
            str(index),
            "--seed",
            str(self.config.seed),
            "--keys",
            str(self.config.keys),
            "--rate",
            str(self.config.rate),
            "--t0",
            str(self.t0_wall),
            "--application-name",
            f"{self.prefix}-w{index}",
            "--run-id",
            self.names.run_id,
            "--out",
            str(self._writes_file(index)),
            *(arg for topic in self.names.topics for arg in ("--topic", topic)),
        )
        return self._child(
            f"writer-{index}", "writer", argv, {DATABASE_ENV: self.target.database_url}
        )

    def _writes_file(self, index: int) -> Path:
        return self.config.workdir / f"writes-{index}.jsonl"

    def _extra_consumer(self, group: str) -> Child:
        index = self.names.consumers.index(group)
        extra = self._consumer(index, role="extra-consumer")
        extra.name = f"extra-{group.rsplit('-', 1)[-1]}-{len(self.fleet.children)}"
        extra.log = self.config.workdir / f"{extra.name}.log"
        self.fleet.add(extra).start()
        return extra

    def execute(self) -> tuple[History, Report]:
        config = self.config
        config.workdir.mkdir(parents=True, exist_ok=True)
        setup(config, self.target, self.names)
        sampler = TokenSampler(
            self.target.database_url,
            self.target.schema,
            self.names.relay_group,
            self.names.consumers,
            self.t0,
        )
        stack = self.target.stack
        nemesis = Nemesis(
            seed=config.seed,
            fleet=self.fleet,
            database_url=self.target.database_url,
            application_prefix=self.prefix,
            start_extra_consumer=self._extra_consumer,
            stack=stack,
            mean_interval=3.0,
            t0=self.t0,
        )
        try:
            for i in range(config.relays):
                self.fleet.add(self._relay(i)).start()
            for i in range(config.consumers):
                self.fleet.add(self._consumer(i)).start()
            for i in range(config.writers):
                self.fleet.add(self._writer(i)).start()
            self._wait_ready()
            sampler.start()
            self._loop(nemesis)
            self._drain(nemesis)
        finally:
            nemesis.finish()
            self.fleet.stop(timeout=30)
            sampler.stop()
        return self._judge(nemesis, sampler)

    def _wait_ready(self, timeout: float = 180.0) -> None:
        """Python processes start slowly on a busy machine: the clock starts once the writers
        write and a relay holds a lease, so the whole duration is under load and faults."""
        deadline = time.monotonic() + timeout
        waiting = "writers"
        while time.monotonic() < deadline:
            self.fleet.supervise(lambda child, point: None)
            if all(self._writes_file(i).exists() for i in range(self.config.writers)):
                waiting = "a relay to hold a lease"
                if self._leases() > 0:
                    return
            time.sleep(0.5)
        raise VerifyError(
            f"the run's processes did not start within {timeout:.0f}s: waiting for"
            f" {waiting}; see the logs in {self.config.workdir}"
        )

    def _leases(self) -> int:
        with db.connect(self.target.database_url) as conn:
            row = conn.execute(
                f"SELECT count(*) FROM {self.target.schema}.relay_lease"
                " WHERE relay_group = %s AND holder IS NOT NULL",
                (self.names.relay_group,),
            ).fetchone()
        return int(row[0]) if row else 0

    def _loop(self, nemesis: Nemesis) -> None:
        ready = time.monotonic()
        nemesis.begin(ready)
        end = ready + self.config.duration
        next_note = ready + 30
        while time.monotonic() < end:
            nemesis.step()
            self.fleet.supervise(nemesis.kill_point_hit)
            if time.monotonic() >= next_note:
                next_note += 30
                self.echo(
                    f"  {time.monotonic() - ready:4.0f}s: {len(nemesis.faults)} faults injected,"
                    f" {self.fleet.restarts} restarts"
                )
            time.sleep(0.1)

    def _drain(self, nemesis: Nemesis) -> None:
        """Writers stop; faults stop; relays and consumers finish the backlog."""
        self.fleet.stop("writer", timeout=30)
        nemesis.finish()
        for child in self.fleet.children:
            child.next_fault = None  # no kill point armed by a restart from here on
        self.fleet.resume_all()
        started = time.monotonic()
        deadline = started + self.config.drain_timeout
        drained_since: float | None = None
        while time.monotonic() < deadline:
            self.fleet.supervise(nemesis.kill_point_hit)
            try:
                now = collect.progress(
                    self.target.database_url,
                    self.target.schema,
                    self.names.topics,
                    self.names.consumers,
                )
            except psycopg.Error:
                time.sleep(1)
                continue
            if now.drained:
                drained_since = drained_since or time.monotonic()
                if time.monotonic() - drained_since >= 2.0:  # and stays so (late duplicates)
                    break
            else:
                drained_since = None
            time.sleep(0.5)
        self.drain_seconds = time.monotonic() - started

    def _judge(self, nemesis: Nemesis, sampler: TokenSampler) -> tuple[History, Report]:
        config, names = self.config, self.names
        topics = tuple(TopicSpec(name=t, partitions=config.partitions) for t in names.topics)
        consumers = tuple(
            ConsumerSpec(
                name=name,
                topics=tuple(names.topics),
                clients=(client,),
                processes=len(range(i, config.consumers, 2)),
            )
            for i, (name, client) in enumerate(zip(names.consumers, CLIENTS, strict=True))
        )
        params = RunParams(
            seed=config.seed,
            mode="exactly_once",
            duration_s=config.duration,
            writers=config.writers,
            relays=config.relays,
            relay_group=names.relay_group,
            shards=self._shards(),
            topics=topics,
            consumers=consumers,
            stack=self.target.self_started,
            options={
                "run_id": names.run_id,
                "rate": config.rate,
                "keys": config.keys,
                "drain_s": round(self.drain_seconds, 1),
                "restarts": self.fleet.restarts,
            },
        )
        writes = collect.read_writes(self._writes_file(i) for i in range(config.writers))
        effects, inbox = collect.read_database(
            self.target.database_url, self.target.schema, names.consumers
        )
        try:
            records = collect.read_topics(self.target.kafka, topics)
        except collect.CollectError as exc:
            records = []
            self.problems.append(str(exc))
        history = History(
            params=params,
            writes=writes,
            kafka=records,
            effects=effects,
            inbox=inbox,
            relay_tokens=sampler.relay,
            inbox_tokens=sampler.inbox,
            faults=sorted(nemesis.faults, key=lambda f: f.time),
        )
        report = check(history, exactly_once=True)
        self.problems += nemesis.errors + _idle(report)
        self.notes = nemesis.notes
        return history, report

    def _shards(self) -> int:
        with db.connect(self.target.database_url) as conn:
            row = conn.execute(
                f"SELECT shard_count FROM {self.target.schema}.outbox_setting"
            ).fetchone()
        return int(row[0]) if row else 1


def _idle(report: Report) -> list[str]:
    """A run that wrote, published or consumed nothing proves nothing: that fails it too."""
    t = report.totals
    missing = [
        what
        for what, n in (
            ("committed", t.committed),
            ("published", t.published),
            ("settled", t.consumed),
        )
        if n == 0
    ]
    return [f"nothing {what}: the run exercised nothing" for what in missing]
