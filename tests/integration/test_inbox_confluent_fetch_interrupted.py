"""A ``KeyboardInterrupt`` that lands in confluent-kafka's fetch, caught around ``poll_batch()``,
and the same consumer polled on, on the real stack: every record runs, once, none skipped.

The client's ``consume()`` is wrapped to raise it right after the real call returned messages:
what a Ctrl-C during a blocking poll does (it is raised as the C call returns). librdkafka's
position was already past those messages, so before, the next polls fetched the records behind
them, and the offsets committed for those went past records that never ran (their effects never
happened, and no restart delivered them again). Now the next poll seeks every assigned
partition back to the first record the consumer had not taken.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from outboxkit.inbox import HandlerContext, Inbox, InboxSettings, OutcomeKind, RetryPolicy
from outboxkit.inbox.confluent import ConfluentInboxConsumer
from outboxkit.kafka import confluent_consumer
from outboxkit.kafka.confluent_positions import REWIND_ATTEMPTS
from outboxkit.settings import KafkaSettings
from tests.integration.inbox_support import (
    EFFECT_DDL,
    INSERT_EFFECT,
    REGISTRY,
    PaymentRequested,
    headers_for,
    inbox_row,
    payload,
    produce,
)

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
#: Seconds within which every record must have run (lost ones never do: the test fails then).
DEADLINE = 30.0
PER_PARTITION = 8


class Cuts:
    """When the wrapped ``consume()`` raises: ``pick(call)`` for each call that returned
    records (``call``: its message count asked for, its records), ``True`` to cut it."""

    def __init__(self, pick: Callable[[int, list[Any]], bool]) -> None:
        self.pick = pick
        self.lost: list[tuple[str, int, int]] = []  # the records of the calls cut

    def after(self, asked: int, messages: list[Any]) -> None:
        records = [m for m in messages if m.error() is None]
        if records and self.pick(asked, records):
            self.lost += [(m.topic(), m.partition(), m.offset()) for m in records]
            raise KeyboardInterrupt  # as a Ctrl-C during the blocking call is, at its return


@pytest.fixture
def cuts(monkeypatch: pytest.MonkeyPatch) -> list[Cuts]:
    """The consumer clients created in the test cut their fetches as ``cuts[-1]`` says."""
    plans: list[Cuts] = []

    class Interrupted(Consumer):  # the callbacks get this very object: the adapter knows it
        def consume(self, *args: Any, **kwargs: Any) -> list[Any]:
            messages: list[Any] = super().consume(*args, **kwargs)
            if plans:
                plans[-1].after(args[0] if args else kwargs.get("num_messages", 1), messages)
            return messages

    monkeypatch.setattr(confluent_consumer, "Consumer", Interrupted)
    return plans


def _produce(bootstrap: str, topic: str, partitions: int) -> list[str]:
    event_ids = []
    for partition in range(partitions):
        ids = [str(uuid.uuid4()) for _ in range(PER_PARTITION)]
        produce(bootstrap, topic, [(b"k", payload("o", 1), headers_for(i)) for i in ids], partition)
        event_ids += ids
    return event_ids


def _succeeded(db_url: str, event_ids: list[str]) -> bool:
    rows = [inbox_row(db_url, "billing", e) for e in event_ids]
    return all(row is not None and row["state"] == "succeeded" for row in rows)


def _effect_counts(db_url: str) -> Counter[str]:
    with psycopg.connect(db_url) as conn:
        return Counter(r[0] for r in conn.execute("SELECT event_id FROM public.effect"))


def _consumer(engine: Engine, bootstrap: str, topic: str, group: str, handle: Any) -> Any:
    settings = InboxSettings(
        consumer="billing", registry=REGISTRY, policy=RetryPolicy(initial_delay=0.5)
    )
    return ConfluentInboxConsumer(
        Inbox(engine, handle, settings),
        KafkaSettings(bootstrap=bootstrap),
        group_id=group,
        topics=[topic],
        dead_letter=None,
        batch_max_records=5,
        batch_max_ms=50.0,
        max_records=5,
    )


def _poll_until(consumer: Any, done: Callable[[], bool]) -> tuple[int, Counter[OutcomeKind]]:
    """Poll as an application that catches ``KeyboardInterrupt`` and goes on: how many it
    caught, and the outcomes. Ends once ``done()`` or after :data:`DEADLINE`."""
    caught, kinds, deadline = 0, Counter[OutcomeKind](), time.monotonic() + DEADLINE
    while not done() and time.monotonic() < deadline:
        try:
            kinds.update(o.kind for o in consumer.poll_batch(0.2))
        except KeyboardInterrupt:
            caught += 1
    return caught, kinds


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    client = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = client.committed([TopicPartition(topic, p) for p in range(partitions)], 30)
        return [p.offset for p in found]
    finally:
        client.close()


class Handler:
    def __init__(self, fail_first: set[str] | None = None) -> None:
        self.runs: Counter[str] = Counter()
        self.attempts: set[tuple[str, int]] = set()
        self.fail_first = fail_first or set()

    def __call__(self, event: PaymentRequested, ctx: HandlerContext, session: Session) -> None:
        self.runs[ctx.event_id] += 1
        self.attempts.add((ctx.event_id, ctx.attempt))
        if ctx.event_id in self.fail_first and ctx.attempt == 1:
            raise RuntimeError("not yet")  # held for a retry: its partition paused, sought back
        params = {"order_id": event.order_id, "amount": event.amount, "attempt": ctx.attempt}
        session.execute(INSERT_EFFECT, {"event_id": ctx.event_id, **params})


def _nth(n: int) -> Callable[[int, list[Any]], bool]:
    seen = [0]

    def pick(asked: int, records: list[Any]) -> bool:
        seen[0] += 1
        return seen[0] == n

    return pick


def _topped_up() -> Callable[[int, list[Any]], bool]:
    """The first of a poll's second calls (it takes what is already fetched) that returned
    records: the first call's records are lost with it."""
    seen = [0]

    def pick(asked: int, records: list[Any]) -> bool:
        seen[0] += asked > 1
        return asked > 1 and seen[0] == 1

    return pick


PICKS: dict[str, Callable[[], Callable[[int, list[Any]], bool]]] = {
    "first fetch": lambda: _nth(1),
    "top-up fetch": _topped_up,
    "third fetch": lambda: _nth(3),
}


@pytest.mark.parametrize("when", list(PICKS))
def test_a_fetch_cut_by_a_keyboard_interrupt_loses_no_record(
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    cuts: list[Cuts],
    when: str,
) -> None:
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    topic = outboxkit_topic(partitions=2)
    event_ids = _produce(outboxkit_kafka_bootstrap, topic, 2)
    engine, handle = create_engine(sa_url), Handler()
    group = f"g-{uuid.uuid4().hex[:8]}"
    cut = Cuts(PICKS[when]())
    cuts.append(cut)
    try:
        with _consumer(engine, outboxkit_kafka_bootstrap, topic, group, handle) as consumer:
            caught, kinds = _poll_until(consumer, lambda: _succeeded(outboxkit_db_url, event_ids))
    finally:
        engine.dispose()
    assert caught == 1  # the fetch was cut once, with records in it
    assert cut.lost
    assert _succeeded(outboxkit_db_url, event_ids), f"lost with the cut fetch: {cut.lost}"
    assert kinds == Counter({OutcomeKind.SUCCEEDED: len(event_ids)})  # none came twice
    assert handle.runs == Counter(dict.fromkeys(event_ids, 1))  # each ran once
    assert _effect_counts(outboxkit_db_url) == Counter(dict.fromkeys(event_ids, 1))
    assert _committed(outboxkit_kafka_bootstrap, group, topic, 2) == [PER_PARTITION] * 2


def test_a_first_fetch_cut_goes_back_to_the_committed_offsets(
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    cuts: list[Cuts],
) -> None:
    """A member whose first fetch is cut starts its partitions again where they started: the
    offsets committed by the one before (not where ``auto.offset.reset`` would start them)."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    topic = outboxkit_topic(partitions=2)
    first = _produce(outboxkit_kafka_bootstrap, topic, 2)
    engine, handle = create_engine(sa_url), Handler()
    group = f"g-{uuid.uuid4().hex[:8]}"
    try:
        with _consumer(engine, outboxkit_kafka_bootstrap, topic, group, handle) as consumer:
            assert _poll_until(consumer, lambda: _succeeded(outboxkit_db_url, first))[0] == 0
        later = _produce(outboxkit_kafka_bootstrap, topic, 2)
        cut = Cuts(_nth(1))
        cuts.append(cut)
        with _consumer(engine, outboxkit_kafka_bootstrap, topic, group, handle) as consumer:
            caught, kinds = _poll_until(consumer, lambda: _succeeded(outboxkit_db_url, later))
    finally:
        engine.dispose()
    assert caught == 1
    assert cut.lost
    assert _succeeded(outboxkit_db_url, later), f"lost with the cut fetch: {cut.lost}"
    assert handle.runs == Counter(dict.fromkeys(first + later, 1))
    # not sought back to the start of the log: none of the first records came again
    assert kinds == Counter({OutcomeKind.SUCCEEDED: len(later)})
    assert _committed(outboxkit_kafka_bootstrap, group, topic, 2) == [2 * PER_PARTITION] * 2


def test_a_fetch_cut_while_a_partition_is_held_for_a_retry(
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    cuts: list[Cuts],
) -> None:
    """Partition 0's second record fails once: the partition is paused and sought back to it
    until its retry is due. A fetch cut meanwhile (of partition 1, or of partition 0 once
    resumed) leaves the hold as it is: the held record runs again, and nothing is lost."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    topic = outboxkit_topic(partitions=2)
    event_ids = _produce(outboxkit_kafka_bootstrap, topic, 2)
    held = event_ids[1]  # partition 0, offset 1
    engine, handle = create_engine(sa_url), Handler(fail_first={held})
    group = f"g-{uuid.uuid4().hex[:8]}"

    def while_held(asked: int, records: list[Any]) -> bool:
        # failed once, not run again yet; twice at most (every fetch cut would hand none over)
        return handle.runs[held] == 1 and len(cut.lost) < 2 * PER_PARTITION

    cut = Cuts(while_held)
    cuts.append(cut)
    try:
        with _consumer(engine, outboxkit_kafka_bootstrap, topic, group, handle) as consumer:
            caught, kinds = _poll_until(consumer, lambda: _succeeded(outboxkit_db_url, event_ids))
    finally:
        engine.dispose()
    assert caught >= 1
    assert cut.lost
    assert _succeeded(outboxkit_db_url, event_ids), f"lost with the cut fetches: {cut.lost}"
    # the records of the held one's first batch ran again in it (a failure reruns a batch)
    assert handle.attempts == {(e, 1) for e in event_ids} | {(held, 2)}
    assert kinds == Counter({OutcomeKind.SUCCEEDED: len(event_ids), OutcomeKind.RETRY: 1})
    assert _effect_counts(outboxkit_db_url) == Counter(dict.fromkeys(event_ids, 1))
    assert _committed(outboxkit_kafka_bootstrap, group, topic, 2) == [PER_PARTITION] * 2


def test_a_client_that_keeps_refusing_the_seek_back_is_replaced(
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    cuts: list[Cuts],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The seek back after a cut fetch keeps failing for one partition (librdkafka refuses a
    seek with ``_STATE`` while it is not fetching): the polls after it fetch nothing, but
    not for ever, nor as fast as they can. After :data:`REWIND_ATTEMPTS` the client is given
    up; the new one starts from the committed offsets, and every record runs, once."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    topic = outboxkit_topic(partitions=2)
    event_ids = _produce(outboxkit_kafka_bootstrap, topic, 2)
    engine, handle = create_engine(sa_url), Handler()
    group = f"g-{uuid.uuid4().hex[:8]}"
    cut = Cuts(_nth(1))
    cuts.append(cut)
    interrupted = confluent_consumer.Consumer  # the fixture's

    class Refusing(interrupted):  # type: ignore[misc, valid-type]
        def seek(self, partition: TopicPartition) -> None:
            if partition.partition == 1:
                raise KafkaException(KafkaError(KafkaError._STATE))
            super().seek(partition)

    monkeypatch.setattr(confluent_consumer, "Consumer", Refusing)
    caplog.set_level(logging.WARNING, logger="outboxkit.kafka.consumer")
    try:
        with _consumer(engine, outboxkit_kafka_bootstrap, topic, group, handle) as consumer:
            caught, kinds = _poll_until(consumer, lambda: _succeeded(outboxkit_db_url, event_ids))
    finally:
        engine.dispose()
    assert caught == 1
    assert _succeeded(outboxkit_db_url, event_ids), f"stuck after the cut fetch: {cut.lost}"
    refused = [r for r in caplog.records if "back failed" in r.getMessage()]
    assert len(refused) == REWIND_ATTEMPTS  # each poll's timeout waited, then replaced
    assert kinds[OutcomeKind.SUCCEEDED] == len(event_ids)  # anything else: a known duplicate
    assert handle.runs == Counter(dict.fromkeys(event_ids, 1))
    assert _effect_counts(outboxkit_db_url) == Counter(dict.fromkeys(event_ids, 1))
    assert _committed(outboxkit_kafka_bootstrap, group, topic, 2) == [PER_PARTITION] * 2
