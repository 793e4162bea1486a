"""What the dedup middleware costs a consumer: events/s with it vs a bare consumer.

Run: ``python benchmarks/consumer.py`` (starts its own durable PostgreSQL and a Kafka broker
unless ``OUTBOXKIT_DATABASE_URL`` and ``OUTBOXKIT_KAFKA_BOOTSTRAP`` name running ones; a scratch
database is created and dropped either way).

Every variant consumes the same topic (``read_committed``, auto-commit off), writes one effect
row per event in PostgreSQL and commits offsets every second (safe for the middleware because a
redelivery is recognised), for both clients side by side:

* ``bare/event``: a bare consumer, one transaction per event;
* ``bare/batch``: a bare consumer, one transaction per fetched batch (at most 50 rows);
* ``mw/event`` (the old path): the middleware, one delivery at a time: a claim of its own, then
  the handler's transaction with the token-conditional ``succeeded`` mark;
* ``mw/batch``: the middleware batched: one claim statement per batch, one transaction with
  the handlers run without savepoints (a failure would make the batch run again with a
  savepoint per handler; none fails here), one statement marking the successes.
* ``mw/b-conn``: ``mw/batch`` with the handler running the same Core statement on
  ``session.connection()`` instead of ``session.execute`` (the ORM path), as the bare consumers
  do on their ``Connection``: ``mw/b-conn : bare/batch`` compares the same statement path.

``--columns`` runs a subset of the columns. ``--steps`` also prints, for each middleware run,
the time each step of the inbox core took per event (``inbox_steps.py``). ``--tune-gc`` first
applies the garbage-collector settings ``outboxkit inbox run`` uses (``outboxkit.gc_tuning``) to
this whole process, so the bare consumers and the middleware run with them alike.

The inbox table starts with ``--history`` (100,000) finished rows of an earlier consumer,
analysed, as a deployment's table looks after a while (``--history 0``: a brand-new table).

Variants run interleaved (alternating rounds); the median of the rounds is printed. Each rate is
counted from the end of the first batch on (``Meter``), so start-up is left out of every variant
alike. Nothing asserts on speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import psycopg
import pydantic
from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from inbox_steps import print_steps, timed_steps
from psycopg import sql
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outboxkit.db import migrator, sqlalchemy_url
from outboxkit.devstack import DevStack
from outboxkit.devstack.postgres import PostgresServer, database_url_with
from outboxkit.gc_tuning import tune_gc
from outboxkit.inbox import AsyncInbox, EventRegistry, HandlerContext, Inbox, InboxSettings
from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer
from outboxkit.inbox.confluent import ConfluentInboxConsumer
from outboxkit.settings import KafkaSettings
from outboxkit.wire import dict_to_headers

EFFECT_DDL = (
    "CREATE TABLE public.effect (id bigserial PRIMARY KEY, event_id text NOT NULL,"
    " amount integer NOT NULL)"
)
INSERT = text("INSERT INTO public.effect (event_id, amount) VALUES (:event_id, :amount)")


class Charged(pydantic.BaseModel):
    amount: int


REGISTRY = EventRegistry()
REGISTRY.register(Charged, event_type="charged")


def _conf(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    }


BATCH = 50

# The inbox table as a deployment's looks after a while: finished rows of earlier events,
# analysed by autovacuum. A brand-new table (``--history 0``) is a different regime: until its
# first ANALYZE the planner guesses its size, and the batch mark may read all of it.
HISTORY_ROWS = 100_000
HISTORY_SQL = """
INSERT INTO outboxkit.inbox_message
    (consumer, event_id, content_digest, event_type, state, attempts, lease_owner, lease_token,
     topic, kafka_partition, kafka_offset, finished_at)
SELECT 'history', 'h' || g, '\\x00', 'charged', 'succeeded', 1, 'o', g, 'old', 0, g, now()
FROM generate_series(1, %(rows)s) AS g
"""


class Meter:
    """Events/s from the end of the first batch (or event) to the end of the one that reaches
    ``events``: every variant's start-up (group join, first fetch, first statements) is left
    out alike, with the first batch's events, and so is the last offset commit (the bare
    consumers make it in their loop, the middleware when it closes)."""

    def __init__(self, events: int) -> None:
        self.events = events
        self.done = 0
        self._first = 0
        self._started = 0.0
        self._ended = 0.0

    def add(self, count: int) -> None:
        self.done += count
        if not self._started and count:
            self._started, self._first = time.perf_counter(), self.done
        if self.done >= self.events and not self._ended:
            self._ended = time.perf_counter()

    def rate(self) -> float:
        if self.done == self._first:
            raise RuntimeError("every event came in the first batch: use more --events")
        counted = min(self.done, self.events) - self._first  # none after the clock stopped
        return counted / ((self._ended or time.perf_counter()) - self._started)


def bare_confluent_batch(
    url: str, bootstrap: str, topic: str, events: int, interval: float, bulk: bool = False
) -> float:
    """``bulk``: the batch's rows in one ``executemany`` (what a batch handler does)."""
    engine = create_engine(url)
    consumer = Consumer(_conf(bootstrap))
    consumer.subscribe([topic])
    meter, last_commit = Meter(events), time.monotonic()
    try:
        while meter.done < events:
            msgs = [m for m in consumer.consume(BATCH, 1.0) if not m.error()]
            if not msgs:
                continue
            with engine.begin() as conn:
                rows = [
                    {"event_id": msg.key().decode(), "amount": json.loads(msg.value())["amount"]}
                    for msg in msgs
                ]
                for chunk in [rows] if bulk else rows:  # a list: one executemany
                    conn.execute(INSERT, chunk)
            meter.add(len(msgs))
            if meter.done >= events or time.monotonic() - last_commit >= interval:
                consumer.commit(message=msgs[-1], asynchronous=False)
                last_commit = time.monotonic()
        return meter.rate()
    finally:
        consumer.close()
        engine.dispose()


def bare_confluent(url: str, bootstrap: str, topic: str, events: int, interval: float) -> float:
    engine = create_engine(url)
    consumer = Consumer(_conf(bootstrap))
    consumer.subscribe([topic])
    meter, last_commit = Meter(events), time.monotonic()
    try:
        while meter.done < events:
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            body = json.loads(msg.value())
            with engine.begin() as conn:
                conn.execute(INSERT, {"event_id": msg.key().decode(), "amount": body["amount"]})
            meter.add(1)
            if meter.done == events or time.monotonic() - last_commit >= interval:
                consumer.commit(message=msg, asynchronous=False)
                last_commit = time.monotonic()
        return meter.rate()
    finally:
        consumer.close()
        engine.dispose()


def _orm_handler(event: Charged, ctx: HandlerContext, session: Session) -> None:
    session.execute(INSERT, {"event_id": ctx.event_id, "amount": event.amount})


def _core_handler(event: Charged, ctx: HandlerContext, session: Session) -> None:
    session.connection().execute(INSERT, {"event_id": ctx.event_id, "amount": event.amount})


def middleware_confluent(
    url: str,
    bootstrap: str,
    topic: str,
    events: int,
    interval: float,
    batch: int = 1,
    core: bool = False,
) -> float:
    engine = create_engine(url)
    handle = _core_handler if core else _orm_handler

    settings = InboxSettings(consumer=f"bench-{uuid.uuid4().hex[:6]}", registry=REGISTRY)
    consumer = ConfluentInboxConsumer(
        Inbox(engine, handle, settings),
        KafkaSettings(bootstrap=bootstrap),
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        topics=[topic],
        poll_timeout=1.0,
        offset_commit_interval=interval,
        dead_letter=None,
        batch_max_records=batch,
    )
    meter = Meter(events)
    try:
        with consumer:
            while meter.done < events:
                meter.add(len(consumer.poll_batch()))
        return meter.rate()
    finally:
        engine.dispose()


def _aiokafka_consumer(bootstrap: str, topic: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )


async def _bare_aiokafka(
    url: str, bootstrap: str, topic: str, events: int, interval: float
) -> float:
    engine = create_async_engine(url)
    consumer = _aiokafka_consumer(bootstrap, topic)
    await consumer.start()
    meter, last_commit = Meter(events), time.monotonic()
    try:
        while meter.done < events:
            batches = await consumer.getmany(timeout_ms=1000, max_records=100)
            for records in batches.values():
                for msg in records:
                    body = json.loads(msg.value)
                    async with engine.begin() as conn:
                        await conn.execute(
                            INSERT, {"event_id": msg.key.decode(), "amount": body["amount"]}
                        )
                    meter.add(1)
                    if meter.done == events or time.monotonic() - last_commit >= interval:
                        tp = TopicPartition(msg.topic, msg.partition)
                        await consumer.commit({tp: msg.offset + 1})
                        last_commit = time.monotonic()
        return meter.rate()
    finally:
        await consumer.stop()
        await engine.dispose()


async def _bare_aiokafka_batch(
    url: str, bootstrap: str, topic: str, events: int, interval: float, bulk: bool = False
) -> float:
    engine = create_async_engine(url)
    consumer = _aiokafka_consumer(bootstrap, topic)
    await consumer.start()
    meter, last_commit = Meter(events), time.monotonic()
    try:
        while meter.done < events:
            batches = await consumer.getmany(timeout_ms=1000, max_records=BATCH)
            msgs = [msg for records in batches.values() for msg in records]
            if not msgs:
                continue
            async with engine.begin() as conn:
                rows = [
                    {"event_id": msg.key.decode(), "amount": json.loads(msg.value)["amount"]}
                    for msg in msgs
                ]
                for chunk in [rows] if bulk else rows:  # a list: one executemany
                    await conn.execute(INSERT, chunk)
            meter.add(len(msgs))
            if meter.done >= events or time.monotonic() - last_commit >= interval:
                await consumer.commit(
                    {TopicPartition(m.topic, m.partition): m.offset + 1 for m in msgs}
                )
                last_commit = time.monotonic()
        return meter.rate()
    finally:
        await consumer.stop()
        await engine.dispose()


async def _orm_handler_async(event: Charged, ctx: HandlerContext, session: AsyncSession) -> None:
    await session.execute(INSERT, {"event_id": ctx.event_id, "amount": event.amount})


async def _core_handler_async(event: Charged, ctx: HandlerContext, session: AsyncSession) -> None:
    conn = await session.connection()
    await conn.execute(INSERT, {"event_id": ctx.event_id, "amount": event.amount})


async def _middleware_aiokafka(
    url: str,
    bootstrap: str,
    topic: str,
    events: int,
    interval: float,
    batch: int = 1,
    core: bool = False,
) -> float:
    engine = create_async_engine(url)
    handle = _core_handler_async if core else _orm_handler_async

    settings = InboxSettings(consumer=f"bench-{uuid.uuid4().hex[:6]}", registry=REGISTRY)
    consumer = AiokafkaInboxConsumer(
        AsyncInbox(engine, handle, settings),
        KafkaSettings(bootstrap=bootstrap),
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        topics=[topic],
        poll_timeout=1.0,
        offset_commit_interval=interval,
        dead_letter=None,
        batch_max_records=batch,
    )
    meter = Meter(events)
    try:
        async with consumer:
            while meter.done < events:
                meter.add(len(await consumer.poll_batch()))
        return meter.rate()
    finally:
        await engine.dispose()


def bare_aiokafka(url: str, bootstrap: str, topic: str, events: int, interval: float) -> float:
    return asyncio.run(_bare_aiokafka(url, bootstrap, topic, events, interval))


def bare_aiokafka_batch(
    url: str, bootstrap: str, topic: str, events: int, interval: float, bulk: bool = False
) -> float:
    return asyncio.run(_bare_aiokafka_batch(url, bootstrap, topic, events, interval, bulk))


def middleware_aiokafka(
    url: str, bootstrap: str, topic: str, events: int, interval: float
) -> float:
    return asyncio.run(_middleware_aiokafka(url, bootstrap, topic, events, interval))


def middleware_aiokafka_batch(
    url: str, bootstrap: str, topic: str, events: int, interval: float
) -> float:
    return asyncio.run(_middleware_aiokafka(url, bootstrap, topic, events, interval, BATCH))


def middleware_confluent_batch(
    url: str, bootstrap: str, topic: str, events: int, interval: float
) -> float:
    return middleware_confluent(url, bootstrap, topic, events, interval, BATCH)


def middleware_confluent_batch_core(
    url: str, bootstrap: str, topic: str, events: int, interval: float
) -> float:
    return middleware_confluent(url, bootstrap, topic, events, interval, BATCH, core=True)


def middleware_aiokafka_batch_core(
    url: str, bootstrap: str, topic: str, events: int, interval: float
) -> float:
    return asyncio.run(
        _middleware_aiokafka(url, bootstrap, topic, events, interval, BATCH, core=True)
    )


Runner = Callable[[str, str, str, int, float], float]
INTERVAL = 1.0
COLUMNS = ["bare/event", "bare/batch", "mw/event", "mw/batch", "mw/b-conn"]
VARIANTS: list[tuple[str, str, Runner]] = [
    ("confluent", "bare/event", bare_confluent),
    ("confluent", "bare/batch", bare_confluent_batch),
    ("confluent", "mw/event", middleware_confluent),
    ("confluent", "mw/batch", middleware_confluent_batch),
    ("confluent", "mw/b-conn", middleware_confluent_batch_core),
    ("aiokafka", "bare/event", bare_aiokafka),
    ("aiokafka", "bare/batch", bare_aiokafka_batch),
    ("aiokafka", "mw/event", middleware_aiokafka),
    ("aiokafka", "mw/batch", middleware_aiokafka_batch),
    ("aiokafka", "mw/b-conn", middleware_aiokafka_batch_core),
]


def _produce(bootstrap: str, events: int) -> str:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for n in range(events):
        event_id = str(uuid.uuid4())
        headers = {"event-id": event_id, "event-type": "charged", "idempotency-key": event_id}
        value = json.dumps({"amount": n}).encode()
        producer.produce(topic, value, key=event_id.encode(), headers=dict_to_headers(headers))
        producer.poll(0)
    producer.flush(60)
    return topic


RATIOS = [("mw/batch", "bare/event"), ("mw/batch", "bare/batch"), ("mw/b-conn", "bare/batch")]


def _summary(rates: dict[tuple[str, str], list[float]], columns: list[str]) -> None:
    """Medians per column, then each ratio whose two columns were run: the ratio of the medians,
    and the same ratio round by round (both columns of a round ran minutes apart on the same
    machine, so the spread of those shows how far one run can be trusted)."""
    ratios = [(a, b) for a, b in RATIOS if a in columns and b in columns]
    print(
        f"{'client':10}"
        + "".join(f"{c:>11}" for c in columns)
        + "".join(f"{f'{a} : {b}':>24}" for a, b in ratios)
    )
    for client in ("confluent", "aiokafka"):
        median = {c: statistics.median(rates[(client, c)]) for c in columns}
        row = "".join(f"{median[c]:11.0f}" for c in columns)
        print(f"{client:10}{row}" + "".join(f"{median[a] / median[b]:24.2f}" for a, b in ratios))
    for a, b in ratios:
        for client in ("confluent", "aiokafka"):
            paired = [x / y for x, y in zip(rates[(client, a)], rates[(client, b)], strict=True)]
            print(
                f"  {client:9} {a} : {b} round by round: "
                + ", ".join(f"{r:.2f}" for r in paired)
                + f" (median {statistics.median(paired):.2f})"
            )


@contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A fresh database on the benchmark's server, dropped afterwards."""
    name = f"outboxkit_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield database_url_with(server_url, name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(drop.format(sql.Identifier(name)))


@contextmanager
def migrated_database() -> Iterator[str]:
    """A scratch database at the current schema, on ``OUTBOXKIT_DATABASE_URL``'s server or on a
    durable PostgreSQL started for the run (the relay benchmarks need no Kafka)."""
    external = os.environ.get("OUTBOXKIT_DATABASE_URL")
    server = None if external else PostgresServer(durable=True)
    try:
        if server is not None:
            server.start()
        with scratch_database(external or server.url) as url:  # type: ignore[union-attr]
            migrator.upgrade(url)
            yield url
    finally:
        if server is not None:
            server.stop()


def run(
    server_url: str,
    bootstrap: str,
    events: int,
    rounds: int,
    columns: list[str],
    steps: bool = False,
    history: int = HISTORY_ROWS,
) -> None:
    with scratch_database(server_url) as db_url:
        migrator.upgrade(db_url)
        with psycopg.connect(db_url) as conn:
            conn.execute(EFFECT_DDL)
            conn.execute(HISTORY_SQL, {"rows": history})
        if history:  # a brand-new table stays one no ANALYZE has seen
            with psycopg.connect(db_url, autocommit=True) as conn:
                conn.execute("ANALYZE outboxkit.inbox_message")
        topic = _produce(bootstrap, events)
        rates: dict[tuple[str, str], list[float]] = {}
        chosen = [v for v in VARIANTS if v[1] in columns]
        for round_no in range(1, rounds + 1):
            order = chosen if round_no % 2 else list(reversed(chosen))  # alternate
            for client, variant, runner in order:
                timed = steps and variant.startswith("mw/")
                with timed_steps() if timed else nullcontext({}) as spent:
                    started = time.perf_counter()
                    rate = runner(sqlalchemy_url(db_url), bootstrap, topic, events, INTERVAL)
                    seconds = time.perf_counter() - started
                rates.setdefault((client, variant), []).append(rate)
                print(f"round {round_no}  {client:9} {variant:10} {rate:8.0f} events/s", flush=True)
                if timed:
                    print_steps(f"{client} {variant} steps", spent, events, seconds)
        print(
            f"\n{events} events, one effect row each, offsets every {INTERVAL:g} s;"
            f" median of {rounds} rounds (events/s)"
        )
        _summary(rates, columns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--columns",
        default=",".join(COLUMNS),
        help=f"comma-separated subset of {','.join(COLUMNS)} (default: all)",
    )
    parser.add_argument("--tune-gc", action="store_true", help="as `inbox run` does (all variants)")
    parser.add_argument(
        "--steps", action="store_true", help="time each middleware step (see inbox_steps.py)"
    )
    parser.add_argument(
        "--history",
        type=int,
        default=HISTORY_ROWS,
        help="finished inbox rows of an earlier consumer, analysed, before the runs (0: none)",
    )
    args = parser.parse_args()
    columns = [c for c in COLUMNS if c in args.columns.split(",")]
    if args.tune_gc:
        tune_gc()
    with DevStack(durable=True) as stack:
        run(
            stack.database_url,
            stack.kafka_bootstrap,
            args.events,
            args.rounds,
            columns,
            args.steps,
            args.history,
        )


if __name__ == "__main__":
    main()
