"""Shared pieces of the inbox tests: the event model, handlers, producing, waiting, harnesses.

A harness runs one driver's consumer loop in a background thread (sync + confluent-kafka, or
async + aiokafka inside its own event loop), so every conformance test is written once and run
against both.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outboxkit import db
from outboxkit.events import Event
from outboxkit.inbox import AsyncInbox, EventRegistry, HandlerContext, Inbox, InboxSettings
from outboxkit.inbox.envelope import Envelope, identify
from outboxkit.inbox.metrics import InboxMetrics
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.steps import Sql, TableExecutor, drive_sync
from outboxkit.inbox.store import Claim, InboxStatements
from outboxkit.kafka import KafkaClients
from outboxkit.settings import KafkaSettings
from outboxkit.wire import (
    HEADER_CONTENT_TYPE,
    HEADER_EVENT_ID,
    HEADER_EVENT_TYPE,
    HEADER_IDEMPOTENCY_KEY,
)
from tests.support.raw_headers import RawNames
from tests.support.waiting import wait_for

EVENT_TYPE = "payment.requested"


class PaymentRequested(Event, topic="payments", event_type=EVENT_TYPE):
    order_id: str
    amount: int


REGISTRY = EventRegistry()
REGISTRY.register(PaymentRequested)

EFFECT_DDL = (
    "CREATE TABLE IF NOT EXISTS public.effect ("
    " id bigserial PRIMARY KEY, event_id text NOT NULL, order_id text NOT NULL,"
    " amount integer NOT NULL, attempt integer NOT NULL)"
)
INSERT_EFFECT = text(
    "INSERT INTO public.effect (event_id, order_id, amount, attempt)"
    " VALUES (:event_id, :order_id, :amount, :attempt)"
)


def payload(order_id: str, amount: int) -> bytes:
    return json.dumps({"order_id": order_id, "amount": amount}).encode()


def headers_for(
    event_id: str, event_type: str | None = EVENT_TYPE, key: str | None = None
) -> list[tuple[str, bytes]]:
    out = [
        (HEADER_EVENT_ID, event_id.encode()),
        (HEADER_IDEMPOTENCY_KEY, (key or f"idem-{event_id}").encode()),
        (HEADER_CONTENT_TYPE, b"application/json"),
        ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    ]
    if event_type is not None:
        out.append((HEADER_EVENT_TYPE, event_type.encode()))
    return out


def produce(
    bootstrap: str,
    topic: str,
    messages: list[tuple[bytes | None, bytes, list[Any]]],
    partition: int = 0,
) -> None:
    """Produce (key, value, headers) messages to one partition in order, idempotently."""
    from confluent_kafka import Producer  # here: the consumer app imports this module too

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value, headers in messages:
        producer.produce(topic, value, key=key, headers=headers, partition=partition)
    assert producer.flush(30) == 0


def produce_batch(
    bootstrap: str,
    topic: str,
    messages: list[tuple[bytes | None, bytes, list[tuple[str | bytes, bytes]]]],
    partition: int = 0,
) -> None:
    """Produce the messages as ONE record batch, where a header name may be any bytes
    (confluent-kafka would send ``str()`` of a bytes name)."""

    async def send() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            batch, names = producer.create_batch(), RawNames()
            for key, value, headers in messages:
                named = names.headers(headers)
                assert batch.append(key=key, value=value, timestamp=None, headers=named)
            built = batch._build()  # cached: send_batch sends this very buffer
            built[:] = names.patch(built)
            await (await producer.send_batch(batch, topic, partition=partition))
        finally:
            await producer.stop()

    asyncio.run(send())


def produce_event(
    bootstrap: str,
    topic: str,
    event_id: str,
    order_id: str,
    amount: int,
    key: bytes = b"k",
    partition: int = 0,
) -> None:
    message = (key, payload(order_id, amount), headers_for(event_id))
    produce(bootstrap, topic, [message], partition)


def produce_events(bootstrap: str, topic: str, count: int) -> list[str]:
    """``count`` new events (order "o", amount 1) on partition 0; their ids in order."""
    event_ids = [str(uuid.uuid4()) for _ in range(count)]
    for event_id in event_ids:
        produce_event(bootstrap, topic, event_id, "o", 1)
    return event_ids


def billing_aiokafka_consumer(
    engine: Any, handle: Any, bootstrap: str, topic: str, **options: Any
) -> Any:
    """An aiokafka consumer "billing" of ``topic`` in a group of its own, no dead letters."""
    from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer

    return AiokafkaInboxConsumer(
        AsyncInbox(engine, handle, InboxSettings(consumer="billing", registry=REGISTRY)),
        KafkaSettings(bootstrap=bootstrap),
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        topics=[topic],
        dead_letter=None,
        **options,
    )


def run_sql(engine: Engine, step: Sql) -> db.Result:
    """One inbox statement on an autocommit connection (what the drivers do)."""
    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        return db.run(conn, step.query, step.params)


def claim(engine: Engine, statements: InboxStatements, env: Envelope) -> Claim:
    """Claim the delivery's row as a consumer would (e.g. one that then crashed)."""
    executor = TableExecutor({Sql: lambda step: run_sql(engine, step)})
    return drive_sync(statements.claim_plan(identify(env), env), executor)


def fetch(db_url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url) as conn:
        return conn.execute(sql, params).fetchall()


def inbox_row(db_url: str, consumer: str, event_id: str) -> dict[str, Any] | None:
    with psycopg.connect(db_url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(
            "SELECT * FROM outboxkit.inbox_message WHERE consumer = %s AND event_id = %s",
            (consumer, event_id),
        )
        return cur.fetchone()


def inbox_state(db_url: str, event_id: str, consumer: str = "billing") -> str | None:
    """The event's inbox row state, or ``None`` when it has no row."""
    row = inbox_row(db_url, consumer, event_id)
    return None if row is None else str(row["state"])


def effects(db_url: str, event_id: str | None = None) -> list[tuple[Any, ...]]:
    if event_id is None:
        return fetch(db_url, "SELECT event_id, order_id, amount FROM public.effect ORDER BY id")
    return fetch(
        db_url,
        "SELECT event_id, order_id, amount FROM public.effect WHERE event_id = %s ORDER BY id",
        (event_id,),
    )


class SeamClient:
    """A client of the Kafka seam driven from test code, whichever the client library.

    An aiokafka client lives on an event loop of its own in a background thread (so its
    heartbeats go on between calls); every call is run there.
    """

    def __init__(self, client: str) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self.target: Any = None
        self.closed = False
        if client != "confluent":
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
            self._thread.start()

    def call(self, method: str, *args: Any) -> Any:
        fn = getattr(self.target, method)
        if self._loop is None:
            return fn(*args)

        async def run() -> Any:
            result = fn(*args)
            return await result if inspect.isawaitable(result) else result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(90)

    def close(self) -> None:
        """Close the client (again: nothing)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.call("close")
        finally:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(30)
                self._loop.close()


class Sender(SeamClient):
    """The dead-letter/acks producer of the seam."""

    def __init__(self, client: str, bootstrap: str) -> None:
        super().__init__(client)
        clients = KafkaClients(KafkaSettings(bootstrap=bootstrap))
        sync = client == "confluent"
        self.target = clients.record_sender() if sync else clients.async_record_sender()

    def send(self, topic: str, key: bytes | None, value: bytes | None, headers: Any) -> None:
        self.call("send", topic, key, value, headers)


class GroupMember(SeamClient):
    """One consumer-group member of the seam, recording its rebalance callbacks."""

    def __init__(self, client: str, bootstrap: str, group: str, **config: Any) -> None:
        super().__init__(client)
        self.assigned: list[list[tuple[str, int]]] = []
        self.revoked: list[list[tuple[str, int]]] = []
        self.commit_on_revoke: dict[tuple[str, int], int] = {}
        clients = KafkaClients(KafkaSettings(bootstrap=bootstrap))
        if client == "confluent":
            self.target = clients.group_consumer(group, config=config)
        else:
            self.target = clients.async_group_consumer(group, config=config)

    def subscribe(self, topics: list[str]) -> None:
        self.call("subscribe", topics, self._on_assign, self._on_revoke)

    def _on_assign(self, partitions: list[tuple[str, int]]) -> None:
        self.assigned.append(list(partitions))

    def _on_revoke(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        self.revoked.append(list(partitions))
        return {tp: o for tp, o in self.commit_on_revoke.items() if tp in partitions}

    def poll(self, timeout: float = 0.2) -> list[Any]:
        return list(self.call("poll", timeout, 100))


def poll_members(
    members: list[GroupMember], until: Callable[[list[Any]], Any], *, timeout: float = 90.0
) -> list[Any]:
    """Poll every member in turn (a group rebalances only while its members poll) until
    ``until(records so far)`` holds; returns the records."""
    records: list[Any] = []
    deadline = time.monotonic() + timeout
    while not until(records):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; got {[(r.partition, r.offset) for r in records]}")
        for member in members:
            records.extend(member.poll(0.1))
    return records


@dataclass
class Behaviour:
    """What the test handler does: write one effect row, then maybe fail or wait."""

    fail_attempts: int = 0  # attempts 1..n raise after writing (use a big number for "always")
    wait_until_lost: bool = False  # block (cooperatively) until the lease is lost
    fail_only: str | set[str] | None = None  # if set, only this event id (or these) fails
    wait_only: str | None = None  # if set, only this event id waits until its lease is lost
    started: threading.Event = field(default_factory=threading.Event)
    calls: list[tuple[str, int]] = field(default_factory=list)
    # event id -> a statement run after the effect row with ``sql_params`` (to fail in the db)
    sql: dict[str, Any] = field(default_factory=dict)
    sql_params: dict[str, Any] = field(default_factory=dict)
    swallow_sql_errors: bool = False  # catch the database error of ``sql`` and carry on
    # event id -> a factory of an ORM object the handler adds to its session (flushed after it)
    add_in: dict[str, Callable[[], Any]] = field(default_factory=dict)
    # event ids whose handler calls session.rollback() after its write, then writes again
    rollback_in: set[str] = field(default_factory=set)

    def waits(self, ctx: HandlerContext) -> bool:
        return self.wait_until_lost and self.wait_only in (None, ctx.event_id)

    def before_return(self, ctx: HandlerContext) -> None:
        self.calls.append((ctx.event_id, ctx.attempt))
        only = {self.fail_only} if isinstance(self.fail_only, str) else self.fail_only
        failing = only is None or ctx.event_id in only
        if failing and ctx.attempt <= self.fail_attempts:
            raise RuntimeError(f"boom on attempt {ctx.attempt}")


def _params(event: PaymentRequested, ctx: HandlerContext) -> dict[str, Any]:
    return {
        "event_id": ctx.event_id,
        "order_id": event.order_id,
        "amount": event.amount,
        "attempt": ctx.attempt,
    }


def sync_handler(b: Behaviour) -> Callable[[Any, HandlerContext, Session], None]:
    def handle(event: PaymentRequested, ctx: HandlerContext, session: Session) -> None:
        session.execute(INSERT_EFFECT, _params(event, ctx))
        if ctx.event_id in b.rollback_in:
            session.rollback()
            session.execute(INSERT_EFFECT, _params(event, ctx))
        if ctx.event_id in b.sql:
            try:
                session.execute(b.sql[ctx.event_id], b.sql_params)
            except DBAPIError:
                if not b.swallow_sql_errors:
                    raise
        if ctx.event_id in b.add_in:
            session.add(b.add_in[ctx.event_id]())
        b.started.set()
        if b.waits(ctx):
            deadline = time.monotonic() + 60
            while not ctx.lease_lost and time.monotonic() < deadline:
                time.sleep(0.05)
        b.before_return(ctx)

    return handle


def async_handler(b: Behaviour) -> Callable[[Any, HandlerContext, AsyncSession], Any]:
    async def handle(event: PaymentRequested, ctx: HandlerContext, session: AsyncSession) -> None:
        await session.execute(INSERT_EFFECT, _params(event, ctx))
        if ctx.event_id in b.rollback_in:
            await session.rollback()
            await session.execute(INSERT_EFFECT, _params(event, ctx))
        if ctx.event_id in b.sql:
            try:
                await session.execute(b.sql[ctx.event_id], b.sql_params)
            except DBAPIError:
                if not b.swallow_sql_errors:
                    raise
        if ctx.event_id in b.add_in:
            session.add(b.add_in[ctx.event_id]())
        b.started.set()
        if b.waits(ctx):
            for _ in range(1200):  # at most ~60 s
                if ctx.lease_lost:
                    break
                await asyncio.sleep(0.05)
        b.before_return(ctx)

    return handle


class Harness:
    """One consumer (either adapter) running in a background thread until :meth:`stop`."""

    def __init__(
        self,
        adapter: str,
        *,
        sa_url: str,
        bootstrap: str,
        topics: list[str],
        settings: InboxSettings,
        behaviour: Behaviour,
        group_id: str | None = None,
        dead_letter: str | None = None,
        acks_topic: str | None = None,
        offset_commit_interval: float = 0.0,
        consumer_options: dict[str, Any] | None = None,
        sender_timeout: float | None = None,
    ) -> None:
        self.metrics = InboxMetrics()
        # Bounds the dead-letter/acks producer only (the consumer's clients ignore it), so a
        # test that expects a send to fail need not wait out the 30 s default.
        self.sender_timeout = sender_timeout
        # The suite's topics have no dead-letter topic unless a test makes one.
        self.consumer_options = {"dead_letter_check": "warn", **(consumer_options or {})}
        self.acks_topic = acks_topic
        self.offset_commit_interval = offset_commit_interval
        self.adapter = adapter
        self.sa_url = sa_url
        self.bootstrap = bootstrap
        self.topics = topics
        self.settings = settings
        self.behaviour = behaviour
        self.group_id = group_id or f"g-{uuid.uuid4().hex[:8]}"
        self.dead_letter = dead_letter or "{topic}.dlq"
        self.outcomes: list[Outcome] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def start(self) -> Harness:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "consumer thread did not stop"
        if self.error is not None:
            raise self.error

    def wait_outcomes(self, *event_ids: str) -> None:
        """Wait until each event's final outcome has been returned by ``poll_batch``.

        The inbox row commits inside ``poll_batch``; its outcomes (and metrics) reach the
        test only when the call returns, so a test that reads them must wait on them, not on
        the row."""

        def settled() -> bool:
            if self.error is not None:  # the consumer thread died: say why, do not wait
                raise self.error
            final = {o.event_id for o in list(self.outcomes) if o.kind.advances_offset}
            return set(event_ids) <= final

        wait_for(settled, what=f"outcomes of {', '.join(event_ids)}")

    def _main(self) -> None:
        try:
            if self.adapter == "confluent":
                self._run_confluent()
            else:
                asyncio.run(self._run_aiokafka())
        except BaseException as exc:
            self.error = exc

    def _kafka(self) -> dict[str, Any]:
        return {
            "group_id": self.group_id,
            "topics": self.topics,
            "dead_letter": self.dead_letter,
            "acks_topic": self.acks_topic,
            "offset_commit_interval": self.offset_commit_interval,
            "metrics": self.metrics,
            **self.consumer_options,
        }

    def _quicker(self, cls: Any) -> Any:
        if self.sender_timeout is None:
            return cls
        timeout = self.sender_timeout

        class SenderTimeout(cls):  # type: ignore[misc,valid-type]
            def _clients(self, clients: KafkaClients, group_id: str, config: Any) -> Any:
                return super()._clients(
                    KafkaClients(clients.settings, timeout=timeout), group_id, config
                )

        return SenderTimeout

    def _run_confluent(self) -> None:
        from outboxkit.inbox.confluent import ConfluentInboxConsumer

        engine = create_engine(self.sa_url)
        try:
            inbox = Inbox(engine, sync_handler(self.behaviour), self.settings)
            kafka = KafkaSettings(bootstrap=self.bootstrap)
            consumer_cls = self._quicker(ConfluentInboxConsumer)
            with consumer_cls(inbox, kafka, **self._kafka()) as consumer:
                while not self._stop.is_set():
                    self.outcomes.extend(consumer.poll_batch(0.2))
        finally:
            engine.dispose()

    async def _run_aiokafka(self) -> None:
        from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer

        engine = create_async_engine(self.sa_url)
        try:
            inbox = AsyncInbox(engine, async_handler(self.behaviour), self.settings)
            kafka = KafkaSettings(bootstrap=self.bootstrap)
            consumer_cls = self._quicker(AiokafkaInboxConsumer)
            async with consumer_cls(inbox, kafka, **self._kafka()) as consumer:
                while not self._stop.is_set():
                    self.outcomes.extend(await consumer.poll_batch(0.2))
        finally:
            await engine.dispose()


def wait_refused_again_and_again(harness: Harness, give_up_after: int) -> None:
    """Deliveries retried after an error outside the handler (no event settled), far past the
    point where a record was given up after ``give_up_after`` errors; or the first give-up."""
    from outboxkit.inbox import OutcomeKind

    def refusals() -> int:
        kinds = [(o.kind, o.event_id) for o in list(harness.outcomes)]
        return sum(1 for kind, event_id in kinds if kind is OutcomeKind.RETRY and not event_id)

    def given_up() -> bool:
        return any(o.kind is OutcomeKind.REJECTED for o in list(harness.outcomes))

    wait_for(
        lambda: refusals() >= 3 * give_up_after or given_up() or harness.error,
        what="the refused claims retried",
    )
