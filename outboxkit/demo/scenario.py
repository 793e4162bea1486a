"""The story the demo tells, step by step, against a running PostgreSQL + Kafka.

Writers place orders while two relays (one active, one standby) publish them and a consumer
charges them. Midway the active relay is SIGKILLed and the standby takes over; the consumer is
killed between its database commit and its Kafka offset commit and restarted, so the event comes
again and the inbox suppresses it. Then :mod:`outboxkit.demo.checks` judges the rows.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TextIO

import sqlalchemy as sa

from outboxkit import db
from outboxkit.db.engines import sync_engine
from outboxkit.demo.app import TABLES
from outboxkit.demo.checks import Check, Faults, judge, read_outcome, render
from outboxkit.demo.processes import DemoProcess, Services, start_consumer, start_relay
from outboxkit.demo.progress import Display, Sample, Sampler, status_lines
from outboxkit.demo.writers import WritePlan, Writers
from outboxkit.errors import OutboxkitError
from outboxkit.kafka import KafkaClients
from outboxkit.settings import KafkaSettings

TICK = 0.1
logger = logging.getLogger("outboxkit.demo")


class DemoError(OutboxkitError):
    """The demo could not run its story (a process died, a deadline passed)."""


@dataclass(frozen=True)
class DemoOptions:
    plan: WritePlan = field(default_factory=WritePlan)
    relay_kill_share: float = 0.3  # SIGKILL the active relay once this share is published
    timeout: float = 90.0  # for the whole story, after the services are up

    def expected_events(self) -> int:
        """Roughly how many events the writers commit (for the kill points, not the checks)."""
        plan = self.plan
        return int(plan.writers * plan.orders_per_writer * (1 - plan.rollback_share) * 3)


@dataclass
class DemoResult:
    checks: list[Check]
    faults: Faults
    seconds: float

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


@dataclass
class _Story:
    """What happened so far (read by the loop, turned into :class:`Faults` at the end)."""

    services: Services
    children: list[DemoProcess]  # every process started, to stop at the end
    relay_a: DemoProcess
    relay_b: DemoProcess
    consumer: DemoProcess
    victim: DemoProcess | None = None  # the relay that held the lease when the kill came
    killed_at: datetime | None = None  # database clock
    token_before: int | None = None
    takeover: float | None = None
    token_after: int | None = None
    consumer_killed: bool = False
    duplicate_told: bool = False

    @property
    def played_out(self) -> bool:
        """Every fault that happened has shown its outcome (takeover, suppressed redelivery)."""
        relay = self.killed_at is None or self.takeover is not None
        return relay and (not self.consumer_killed or self.duplicate_told)


PARTITIONS = 3


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    async def create() -> None:
        admin = KafkaClients(KafkaSettings(bootstrap=bootstrap)).admin()
        try:
            await admin.create_topic(topic, partitions, {})
        finally:
            await admin.close()

    asyncio.run(create())


def _copies_in_kafka(bootstrap: str, topic: str, partitions: int) -> int | None:
    """Records beyond one per event id, as a ``read_committed`` reader sees the topic; None
    when there is no confluent-kafka to read it with (then the redeliveries tell)."""
    try:
        from outboxkit.verify.collect import read_topics
    except ImportError:
        return None
    from outboxkit.verify.history import TopicSpec

    settings = KafkaSettings(bootstrap=bootstrap)
    records = read_topics(settings, [TopicSpec(name=topic, partitions=partitions)], timeout=60)
    per_event = Counter(r.event_id for r in records)
    return sum(n - 1 for n in per_event.values())


def _warm_transactions(bootstrap: str, run_id: str) -> None:
    """A fresh broker loads its transaction coordinator on first use, which takes seconds: do
    that now, while the relays start, so relay A's first transaction does not wait for it."""

    async def warm() -> None:
        kafka = KafkaClients(KafkaSettings(bootstrap=bootstrap))
        producer = kafka.transactional_producer(f"outboxkit-demo-warmup-{run_id}")
        try:
            await producer.start()
        finally:
            await producer.close()

    def run() -> None:
        try:
            asyncio.run(warm())
        except OutboxkitError as exc:  # only a head start: the relays retry on their own
            logger.info("transaction coordinator warm-up failed: %s", exc)

    threading.Thread(target=run, name="demo-kafka-warm-up", daemon=True).start()


def _wait(what: str, condition: Callable[[], bool], deadline: float) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise DemoError(f"timed out waiting for {what}")
        time.sleep(TICK)


def run_demo(services: Services, out: TextIO, options: DemoOptions | None = None) -> DemoResult:
    """Tell the story on ``out``, then verify; the caller decides the exit code."""
    options = options or DemoOptions()
    started = time.monotonic()
    display = Display(out, started)
    connect = dict(services.connect_options)
    engine = sync_engine(services.database_url, pool_size=8, connect_args=connect)
    children: list[DemoProcess] = []
    writers = Writers(engine, services.topic, options.plan)
    try:
        _warm_transactions(services.kafka_bootstrap, services.run_id)
        db.migrator.upgrade(services.database_url)
        _create_topic(services.kafka_bootstrap, services.topic, partitions=PARTITIONS)
        sampler = Sampler(
            services.database_url,
            services.topic,
            services.consumer,
            services.relay_group,
            **connect,
        )
        try:
            story = _start(services, options, display, sampler, children, engine)
            writers.start()
            display.event(
                f"{options.plan.writers} writers placing orders (each with its events in the"
                " same transaction; some transactions rolled back)"
            )
            _run(story, writers, sampler, display, options)
            last = sampler.sample()
        finally:
            writers.stop.set()
            writers.join(30)
            for child in reversed(children):
                child.stop()
            sampler.close()
        display.finish()
        faults = Faults(
            takeover_seconds=story.takeover,
            token_before=story.token_before,
            token_after=story.token_after,
            consumer_killed=story.consumer_killed,
            duplicates_suppressed=last.duplicates,
            takeover_limit=services.lease_ttl + 5,
            copies_in_kafka=_copies_in_kafka(services.kafka_bootstrap, services.topic, PARTITIONS),
        )
        checks = judge(writers.log, read_outcome(engine), faults)
    finally:
        engine.dispose()
    result = DemoResult(checks, faults, time.monotonic() - started)
    out.write("\nVerification\n")
    for line in render(checks, color=out.isatty()):
        out.write(line + "\n")
    out.flush()
    return result


def _start(
    services: Services,
    options: DemoOptions,
    display: Display,
    sampler: Sampler,
    children: list[DemoProcess],
    engine: sa.Engine,
) -> _Story:
    deadline = time.monotonic() + 60
    # The consumer commits a batch of deliveries at a time, so the kill point counts commits:
    # the second one is early enough to come in every run, with work before and after it.
    kill_at = 2
    consumer = start_consumer(services, "consumer", fault=f"after_db_commit:{kill_at}")
    children.append(consumer)
    # Both relays start together; whichever takes the lease first is "A", the active one.
    relays = [start_relay(services, f"relay {n}") for n in (1, 2)]
    children.extend(relays)
    pids = {relay.pid: relay for relay in relays}
    TABLES.drop_all(engine)  # while the processes start: the handler needs them only later
    TABLES.create_all(engine)
    _wait("a relay to take the lease", lambda: sampler.sample().holder_pid() in pids, deadline)
    first = sampler.sample()
    relay_a = pids[first.holder_pid() or 0]
    relay_b = relays[1] if relay_a is relays[0] else relays[0]
    relay_a.rename("relay A")
    relay_b.rename("relay B")
    # Every relay keeps one lease-attempt connection: two of them means B is polling too.
    _wait("relay B to poll the lease", lambda: sampler.sample().relays_polling >= 2, deadline)
    display.event(
        f"relay A (pid {relay_a.pid}) is active: it holds the lease, fencing token {first.token}"
    )
    display.event(f"relay B (pid {relay_b.pid}) is standby: it tries to take the lease every 0.25s")
    display.event(
        f"consumer (pid {consumer.pid}) armed to die after its DB commit #{kill_at} (a batch of"
        " deliveries), before committing the Kafka offsets"
    )
    return _Story(services, children, relay_a, relay_b, consumer)


def _run(
    story: _Story,
    writers: Writers,
    sampler: Sampler,
    display: Display,
    options: DemoOptions,
) -> None:
    deadline = time.monotonic() + options.timeout
    kill_relay_at = max(1, int(options.expected_events() * options.relay_kill_share))
    while True:
        sample = sampler.sample()
        written = writers.log.written
        _react(story, sample, written, kill_relay_at, sampler, display)
        for relay in (story.relay_b, story.relay_a):
            if relay.exit_code not in (None, -signal.SIGKILL):
                raise DemoError(f"{relay.name} exited with {relay.exit_code}; see {relay.log}")
        names = {story.relay_a.pid: "relay A", story.relay_b.pid: "relay B"}
        display.status(
            status_lines(
                sample,
                written,
                writers.log.rolled_back_transactions,
                names,
                display.elapsed,
            )
        )
        if not writers.alive and sample.consumed >= written and story.played_out:
            return
        if time.monotonic() > deadline:
            display.event(f"gave up after {options.timeout:.0f}s: the checks below say what")
            return
        time.sleep(TICK)


def _react(
    story: _Story,
    sample: Sample,
    written: int,
    kill_relay_at: int,
    sampler: Sampler,
    display: Display,
) -> None:
    """Play the faults and narrate what the sample shows."""
    relays = {story.relay_a.pid: story.relay_a, story.relay_b.pid: story.relay_b}
    holder = relays.get(sample.holder_pid() or 0)
    if story.victim is None and sample.published >= kill_relay_at and holder is not None:
        # The active relay is A unless an overloaded A already lost its lease to B.
        story.victim, story.token_before = holder, sample.token
        holder.kill()
        story.killed_at = sampler.sample().db_now
        display.event(
            f"SIGKILL {holder.name} (pid {holder.pid}) after it published {sample.published}"
            f" of the {written} events written so far: no clean shutdown, no lease release"
        )
    elif (
        story.killed_at is not None
        and story.takeover is None
        and holder is not None
        and holder is not story.victim
        and sample.acquired_at >= story.killed_at
    ):
        story.takeover = (sample.acquired_at - story.killed_at).total_seconds()
        story.token_after = sample.token
        display.event(
            f"{holder.name} took over {story.takeover:.1f}s after the kill (fencing token"
            f" {story.token_before} -> {story.token_after}: writes under the old token are"
            " refused)"
        )
    consumer = story.consumer
    if consumer.exit_code is None:
        pass
    elif consumer.exit_code != -signal.SIGKILL or story.consumer_killed:
        raise DemoError(f"the consumer exited with {consumer.exit_code}; see {consumer.log}")
    else:  # the armed fault point: SIGKILL between the DB commit and the offset commit
        story.consumer_killed = True
        display.event("consumer killed after committing its DB transaction, before its offset")
        story.consumer = start_consumer(story.services, "consumer")
        story.children.append(story.consumer)
        display.event(f"consumer restarted (pid {story.consumer.pid}): it gets the event again")
    if not story.duplicate_told and sample.duplicates >= 1:
        story.duplicate_told = True
        display.event("the inbox recognised the redelivered event: suppressed, not charged twice")
