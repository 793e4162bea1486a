"""Acknowledgements are at least once on the real stack (both clients): a consumer that dies
after its handler's transaction committed, before the acknowledgement was published (and
before the offset commit), leaves the event succeeded and unacknowledged; the next consumer of
the group gets the record again, finds it a duplicate and publishes the acknowledgement a
producer waits for, with the state, attempts and error as recorded.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from outboxkit.inbox import (
    Envelope,
    HandlerContext,
    Inbox,
    InboxSettings,
    Outcome,
    OutcomeKind,
    RetryPolicy,
)
from tests.integration.inbox_support import (
    EFFECT_DDL,
    REGISTRY,
    Behaviour,
    Harness,
    effects,
    headers_for,
    inbox_row,
    payload,
    produce_event,
)
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]


class Crash(BaseException):
    """The process dying at a fault point: nothing after it runs (no ``except Exception``)."""


@pytest.fixture(
    params=[
        pytest.param(("confluent", 1), id="sync+confluent-one-by-one"),
        pytest.param(("confluent", 50), id="sync+confluent-batch"),
        pytest.param(("aiokafka", 1), id="async+aiokafka-one-by-one"),
        pytest.param(("aiokafka", 50), id="async+aiokafka-batch"),
    ]
)
def mode(request: pytest.FixtureRequest) -> tuple[str, int]:
    adapter, batch = request.param
    return str(adapter), int(batch)


@pytest.fixture
def harnesses(outboxkit_db_url: str) -> Iterator[list[Harness]]:
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    running: list[Harness] = []
    yield running
    for harness in running:
        with contextlib.suppress(Crash):  # the one that died on purpose
            harness.stop()


def _crash_after_db_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """``after_db_commit`` (the handler's transaction committed, nothing else done) kills the
    consumer's thread once, as ``OUTBOXKIT_FAULT=after_db_commit`` kills a process."""
    fired: list[str] = []

    def fault_point(point: str) -> None:
        if point == "after_db_commit" and not fired:
            fired.append(point)
            raise Crash(point)

    for module in ("outboxkit.inbox.delivery", "outboxkit.inbox.batch"):
        monkeypatch.setattr(f"{module}.fault_point", fault_point)


def test_the_next_consumer_acknowledges_an_event_whose_consumer_died_before_acknowledging(
    mode: tuple[str, int],
    harnesses: list[Harness],
    monkeypatch: pytest.MonkeyPatch,
    sa_url: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    adapter, batch = mode
    topic, acks = outboxkit_topic(), outboxkit_topic(prefix="acks")
    group = f"g-{uuid.uuid4().hex[:8]}"
    event_id = str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o-1", 10)

    def start() -> Harness:
        harness = Harness(
            adapter,
            sa_url=sa_url,
            bootstrap=outboxkit_kafka_bootstrap,
            topics=[topic],
            settings=InboxSettings(consumer="billing", registry=REGISTRY),
            behaviour=Behaviour(),
            group_id=group,
            acks_topic=acks,
            consumer_options={"batch_max_records": batch},
        )
        harnesses.append(harness.start())
        return harness

    _crash_after_db_commit(monkeypatch)
    doomed = start()
    wait_for(lambda: doomed.error is not None, what="the first consumer dying after its commit")
    assert isinstance(doomed.error, Crash)
    row: dict[str, Any] = inbox_row(outboxkit_db_url, "billing", event_id) or {}
    assert (row["state"], row["duplicate_count"]) == ("succeeded", 0)
    assert read_topic(outboxkit_kafka_bootstrap, acks, expect=0) == []  # never acknowledged
    monkeypatch.undo()

    start()  # the same group: the offset was never committed, so the record comes again
    wait_for(
        lambda: (inbox_row(outboxkit_db_url, "billing", event_id) or {})["duplicate_count"] == 1,
        what="the redelivery, a duplicate",
    )
    [record] = read_topic(outboxkit_kafka_bootstrap, acks, expect=1)
    body = json.loads(record.value())
    assert record.key() == event_id.encode()
    assert body == {
        "consumer": "billing",
        "event_id": event_id,
        "state": "succeeded",
        "attempts": 1,
        "error": None,
        "topic": topic,
        "partition": 0,
        "offset": 0,
    }
    assert effects(outboxkit_db_url, event_id) == [(event_id, "o-1", 10)]  # the handler ran once


@pytest.mark.parametrize("adapter", ["confluent", "aiokafka"])
def test_a_duplicate_of_a_dead_event_is_acknowledged_dead_as_recorded(
    adapter: str,
    harnesses: list[Harness],
    sa_url: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """The statement that finds the event finished reads its attempts and last error: the
    second copy (a relay duplicate, or a redelivery after a crash) says what the first did."""
    topic, acks = outboxkit_topic(), outboxkit_topic(prefix="acks")
    event_id = str(uuid.uuid4())
    for _ in range(2):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o-1", 10)
    harness = Harness(
        adapter,
        sa_url=sa_url,
        bootstrap=outboxkit_kafka_bootstrap,
        topics=[topic],
        settings=InboxSettings(
            consumer="billing", registry=REGISTRY, policy=RetryPolicy(max_attempts=1)
        ),
        behaviour=Behaviour(fail_attempts=1),
        dead_letter=outboxkit_topic(prefix="dlq"),
        acks_topic=acks,
    )
    harnesses.append(harness.start())
    first, again = (
        json.loads(r.value()) for r in read_topic(outboxkit_kafka_bootstrap, acks, expect=2)
    )
    row: dict[str, Any] = inbox_row(outboxkit_db_url, "billing", event_id) or {}
    assert (row["state"], row["attempts"], row["duplicate_count"]) == ("dead", 1, 1)
    assert "boom on attempt 1" in row["last_error"]
    assert (first["state"], first["attempts"], first["error"], first["offset"]) == (
        "dead",
        1,
        row["last_error"],
        0,
    )
    assert again == {**first, "offset": 1}


def test_a_duplicate_outcome_is_the_plain_duplicate_whatever_its_row_records(
    sa_url: str,
) -> None:
    """Without an acks topic too, ``Inbox.process()`` answers a copy of a finished event as
    before acknowledgements were at least once: no attempts, no error (here the row keeps its
    first attempt's); what the row records rides along, not compared, for the acknowledgement."""
    engine = create_engine(sa_url)
    runs: list[int] = []

    def handler(event: Any, ctx: HandlerContext, session: Session) -> None:
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise TimeoutError("attempt 1")

    settings = InboxSettings(consumer="billing", registry=REGISTRY, policy=RetryPolicy())
    inbox = Inbox(engine, handler, settings)
    event_id = str(uuid.uuid4())

    def env(offset: int) -> Envelope:
        return Envelope.from_parts(
            topic="orders",
            partition=0,
            offset=offset,
            key=b"k",
            value=payload("o1", 1),
            headers=headers_for(event_id),
        )

    try:
        assert inbox.process(env(0)).kind is OutcomeKind.RETRY
        assert inbox.process(env(0)).kind is OutcomeKind.SUCCEEDED
        duplicate = inbox.process(env(1))
    finally:
        engine.dispose()
    assert duplicate == Outcome(OutcomeKind.DUPLICATE, event_id)
    assert (duplicate.attempts, duplicate.error) == (0, None)
    assert duplicate.recorded is not None
    assert duplicate.recorded.state == "succeeded"
    assert duplicate.recorded.attempts == 2
    assert duplicate.recorded.error is not None
    assert "attempt 1" in duplicate.recorded.error
