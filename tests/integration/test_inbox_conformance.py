"""One conformance suite, run over both drivers: sync + confluent-kafka, async + aiokafka.

Messages are produced straight to Kafka with the outboxkit headers; each test checks the
effect rows, the inbox row and the rejection log in the real database.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit.inbox import InboxSettings, OutcomeKind, RetryPolicy
from outboxkit.inbox.readback import cancel_event
from tests.integration.inbox_support import (
    EFFECT_DDL,
    REGISTRY,
    Behaviour,
    GroupMember,
    Harness,
    effects,
    fetch,
    headers_for,
    inbox_row,
    inbox_state,
    payload,
    poll_members,
    produce,
    produce_event,
)
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
Start = Callable[..., Harness]


@pytest.fixture(
    params=[
        pytest.param("confluent", id="sync+confluent"),
        pytest.param("aiokafka", id="async+aiokafka"),
    ]
)
def adapter(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def start(
    adapter: str, outboxkit_db_url: str, sa_url: str, outboxkit_kafka_bootstrap: str
) -> Iterator[Start]:
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    running: list[Harness] = []

    def start_harness(
        topics: list[str], behaviour: Behaviour | None = None, **settings: Any
    ) -> Harness:
        dead_letter = settings.pop("dead_letter", None)
        acks_topic = settings.pop("acks_topic", None)
        interval = settings.pop("offset_commit_interval", 0.0)
        group_id = settings.pop("group_id", None)
        consumer_options = settings.pop("consumer_options", None)
        sender_timeout = settings.pop("sender_timeout", None)
        harness = Harness(
            adapter,
            sa_url=sa_url,
            bootstrap=outboxkit_kafka_bootstrap,
            topics=topics,
            settings=InboxSettings(**{"consumer": "billing", "registry": REGISTRY, **settings}),
            behaviour=behaviour or Behaviour(),
            dead_letter=dead_letter,
            acks_topic=acks_topic,
            offset_commit_interval=interval,
            group_id=group_id,
            consumer_options=consumer_options,
            sender_timeout=sender_timeout,
        )
        running.append(harness.start())
        return harness

    yield start_harness
    for harness in running:
        harness.stop()


def test_each_event_applied_once_and_succeeded(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for n, event_id in enumerate(ids):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o{n}", 10 * n)
    harness = start([topic])
    for event_id in ids:
        wait_for(lambda e=event_id: inbox_state(outboxkit_db_url, e) == "succeeded", what=event_id)
    assert [e[0] for e in effects(outboxkit_db_url)] == ids
    row = inbox_row(outboxkit_db_url, "billing", ids[0])
    assert row is not None
    assert row["attempts"] == 1
    assert row["duplicate_count"] == 0
    assert row["idempotency_key"] == f"idem-{ids[0]}"
    assert row["topic"] == topic
    assert row["kafka_offset"] == 0
    assert row["finished_at"] is not None
    harness.wait_outcomes(*ids)
    assert [o.kind for o in harness.outcomes] == [OutcomeKind.SUCCEEDED] * 3
    registry = harness.metrics.registry
    labels = {"consumer": "billing", "outcome": "succeeded"}
    assert registry.get_sample_value("outboxkit_inbox_outcomes_total", labels) == 3
    count = registry.get_sample_value(
        "outboxkit_inbox_process_seconds_count", {"consumer": "billing"}
    )
    assert count == 3


def test_same_event_twice_one_effect_one_duplicate(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    event_id = str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o1", 5)
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o1", 5)
    start([topic])
    wait_for(
        lambda: (inbox_row(outboxkit_db_url, "billing", event_id) or {}).get("duplicate_count"),
        what="duplicate counted",
    )
    assert len(effects(outboxkit_db_url, event_id)) == 1
    row = inbox_row(outboxkit_db_url, "billing", event_id)
    assert row is not None
    assert (row["state"], row["duplicate_count"], row["attempts"]) == ("succeeded", 1, 1)


def test_same_id_different_content_rejected_original_untouched(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    event_id = str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o1", 5)
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o1", 999)
    start([topic])
    rejections = wait_for(
        lambda: fetch(
            outboxkit_db_url,
            "SELECT reason, kafka_offset FROM outboxkit.inbox_rejection WHERE event_id = %s",
            (event_id,),
        ),
        what="rejection recorded",
    )
    assert len(rejections) == 1
    assert "different content" in rejections[0][0]
    assert rejections[0][1] == 1
    assert effects(outboxkit_db_url, event_id) == [(event_id, "o1", 5)]
    row = inbox_row(outboxkit_db_url, "billing", event_id)
    assert row is not None
    assert (row["state"], row["kafka_offset"], row["duplicate_count"]) == ("succeeded", 0, 0)


def test_garbage_and_unknown_types_rejected_consumer_keeps_going(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    bad_json, unknown, good = (str(uuid.uuid4()) for _ in range(3))
    produce(
        outboxkit_kafka_bootstrap,
        topic,
        [
            (None, b"\x00\xff garbage \xfe", []),  # no headers at all
            (b"k", b"{not json", headers_for(bad_json)),
            (b"k", payload("o", 1), headers_for(unknown, event_type="no.such.type")),
            (b"k", payload("o-good", 7), headers_for(good)),
        ],
    )
    start([topic])
    wait_for(lambda: inbox_state(outboxkit_db_url, good) == "succeeded", what="good event")
    assert effects(outboxkit_db_url) == [(good, "o-good", 7)]
    for event_id, reason in ((bad_json, "not a valid"), (unknown, "unknown event type")):
        row = inbox_row(outboxkit_db_url, "billing", event_id)
        assert row is not None
        assert row["state"] == "rejected"
        assert reason in row["last_error"]
    no_id = fetch(
        outboxkit_db_url,
        "SELECT reason, kafka_offset FROM outboxkit.inbox_rejection WHERE event_id IS NULL",
    )
    assert no_id == [("the message has no event-id header", 0)]


def test_always_failing_handler_goes_dead_with_one_dead_letter(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    dlq = outboxkit_topic(prefix="dlq")
    doomed, later = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, doomed, "o-doomed", 1)
    produce_event(outboxkit_kafka_bootstrap, topic, later, "o-later", 2)
    behaviour = Behaviour(fail_attempts=10**6, fail_only=doomed)
    harness = start(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=3, initial_delay=0.1),
        dead_letter=dlq,
    )
    wait_for(lambda: inbox_state(outboxkit_db_url, doomed) == "dead", what="dead")
    row = inbox_row(outboxkit_db_url, "billing", doomed)
    assert row is not None
    assert row["attempts"] == 3
    assert "boom on attempt 3" in row["last_error"]
    assert effects(outboxkit_db_url, doomed) == []  # every failed attempt rolled back
    # The later event of the same partition runs only after the doomed one ended.
    wait_for(lambda: behaviour.calls and behaviour.calls[-1][0] == later, what="later event ran")
    assert [c for c in behaviour.calls if c[0] == doomed] == [(doomed, 1), (doomed, 2), (doomed, 3)]
    assert behaviour.calls.index((later, 1)) > behaviour.calls.index((doomed, 3))
    records = read_topic(outboxkit_kafka_bootstrap, dlq, expect=1)
    assert len(records) == 1
    headers = dict(records[0].headers())
    assert headers["dlq-event-id"] == doomed.encode()
    assert b"boom on attempt 3" in headers["dlq-error"]
    assert headers["dlq-attempts"] == b"3"
    assert headers["event-id"] == doomed.encode()
    assert records[0].value() == payload("o-doomed", 1)
    harness.wait_outcomes(doomed)
    kinds = [o.kind for o in harness.outcomes if o.event_id == doomed]
    assert kinds == [OutcomeKind.RETRY, OutcomeKind.RETRY, OutcomeKind.DEAD]


def test_transient_failure_retried_in_partition_order(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, first, "o1", 1)
    produce_event(outboxkit_kafka_bootstrap, topic, second, "o2", 2)
    start([topic], Behaviour(fail_attempts=2), policy=RetryPolicy(initial_delay=0.1))
    wait_for(lambda: inbox_state(outboxkit_db_url, second) == "succeeded", what="second event")
    # The first event succeeded on its third run, before the second event: order kept.
    assert [e[0] for e in effects(outboxkit_db_url)] == [first, second]
    row = inbox_row(outboxkit_db_url, "billing", first)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("succeeded", 3)
    assert "boom on attempt 2" in row["last_error"]


def test_cancel_during_processing_sticks_and_rolls_back(
    start: Start,
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    slow, after = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, slow, "o-slow", 1)
    behaviour = Behaviour(wait_until_lost=True)
    harness = start([topic], behaviour, lease_seconds=0.6)
    assert behaviour.started.wait(60), "handler did not start"
    engine = create_engine(sa_url)
    try:
        result = cancel_event(engine, "billing", slow, reason="operator said so")
    finally:
        engine.dispose()
    assert (result.cancelled, result.state) == (True, "cancelled")
    wait_for(lambda: any(o.kind is OutcomeKind.CANCELLED for o in harness.outcomes), what="outcome")
    row = inbox_row(outboxkit_db_url, "billing", slow)
    assert row is not None
    assert (row["state"], row["last_error"]) == ("cancelled", "operator said so")
    assert row["lease_lost_count"] == 1
    assert effects(outboxkit_db_url, slow) == []  # the handler's insert was rolled back
    # The offset moved on: a later event is processed, and the cancelled one never reruns.
    behaviour.wait_until_lost = False
    produce_event(outboxkit_kafka_bootstrap, topic, after, "o-after", 2)
    wait_for(lambda: inbox_state(outboxkit_db_url, after) == "succeeded", what="later event")
    assert [c for c in behaviour.calls if c[0] == slow] == [(slow, 1)]
    assert inbox_state(outboxkit_db_url, slow) == "cancelled"


def test_outcomes_are_acknowledged_on_the_acks_topic(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    acks = outboxkit_topic(prefix="acks")
    good, bad = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, good, "o1", 5)
    # A duplicate: acknowledged again, as recorded (its first delivery may have died before
    # acknowledging it); readers deduplicate by (consumer, event_id).
    produce_event(outboxkit_kafka_bootstrap, topic, good, "o1", 5)
    produce(outboxkit_kafka_bootstrap, topic, [(b"k", b"{broken", headers_for(bad))])
    start([topic], acks_topic=acks)
    wait_for(lambda: inbox_state(outboxkit_db_url, bad) == "rejected", what="rejected")
    records = read_topic(outboxkit_kafka_bootstrap, acks, expect=3)
    bodies = [json.loads(r.value()) for r in records]
    assert [(b["event_id"], b["state"], b["consumer"]) for b in bodies] == [
        (good, "succeeded", "billing"),
        (good, "succeeded", "billing"),
        (bad, "rejected", "billing"),
    ]
    assert bodies[1] == {**bodies[0], "offset": 1}  # the same acknowledgement, of the copy
    assert [r.key() for r in records] == [good.encode(), good.encode(), bad.encode()]
    assert "not a valid" in bodies[2]["error"]


def test_interval_offset_commits_are_flushed_on_close(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    first = [str(uuid.uuid4()) for _ in range(3)]
    for event_id in first:
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o", 1)
    harness = start([topic], offset_commit_interval=600.0, group_id=group)
    wait_for(lambda: inbox_state(outboxkit_db_url, first[-1]) == "succeeded", what="first batch")
    harness.stop()  # nothing was due yet: close commits the settled offsets
    later = str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, later, "o", 2)
    second = start([topic], offset_commit_interval=600.0, group_id=group)
    second.wait_outcomes(later)
    assert [(o.kind, o.event_id) for o in second.outcomes] == [(OutcomeKind.SUCCEEDED, later)]
    assert len(effects(outboxkit_db_url)) == 4


def test_a_partition_held_for_retry_moves_again_after_a_member_joins_and_leaves(
    adapter: str,
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Both partitions are paused for a retry due in ten minutes; a second member joins (every
    partition is revoked, one comes back at once) and leaves (the other comes back). Each comes
    back consuming from its committed offset, so every record ends well before the hold."""
    topic = outboxkit_topic(partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    first = {p: str(uuid.uuid4()) for p in (0, 1)}
    later = {p: str(uuid.uuid4()) for p in (0, 1)}
    for p in (0, 1):
        produce_event(outboxkit_kafka_bootstrap, topic, first[p], f"o{p}", 1, partition=p)
        produce_event(outboxkit_kafka_bootstrap, topic, later[p], f"o{p}", 2, partition=p)
    behaviour = Behaviour(fail_attempts=1, fail_only=set(first.values()))
    harness = start(
        [topic],
        behaviour,
        group_id=group,
        policy=RetryPolicy(initial_delay=600, max_delay=600),
        lease_seconds=3,
    )
    wait_for(
        lambda: sum(o.kind is OutcomeKind.RETRY for o in harness.outcomes) == 2,
        what="both partitions held for a retry",
    )
    member = GroupMember(adapter, outboxkit_kafka_bootstrap, group)
    try:
        member.subscribe([topic])
        poll_members([member], lambda _: member.assigned and member.assigned[-1], timeout=120)
    finally:
        member.close()
    ids = [*first.values(), *later.values()]
    for event_id in ids:
        wait_for(
            lambda e=event_id: inbox_state(outboxkit_db_url, e) == "succeeded",
            timeout=120,
            what=event_id,
        )
    for p in (0, 1):
        row = inbox_row(outboxkit_db_url, "billing", first[p])
        assert row is not None
        assert row["attempts"] == 2
    stuck = fetch(
        outboxkit_db_url,
        "SELECT event_id FROM outboxkit.inbox_message WHERE state = 'processing'",
    )
    assert stuck == []
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted(ids)


# -- batches: several records, one claim statement, one transaction, a savepoint per handler ---
def _finished_at(db_url: str, event_id: str) -> Any:
    row = inbox_row(db_url, "billing", event_id)
    assert row is not None
    return row["finished_at"]


def test_a_failing_handler_in_a_batch_rolls_back_alone_then_goes_dead(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Partition 0: a0, doomed, b0; partition 1: a1, b1 — fetched as one batch. The optimistic
    run (no savepoints) stops at doomed and rolls back; the batch runs again with savepoints,
    doomed left out: a0, a1 and b1 commit together, once; b0 waits behind doomed (its claim
    given back, not counted), which retries and goes dead alone, its handler run once per
    attempt."""
    topic = outboxkit_topic(partitions=2)
    dlq = outboxkit_topic(prefix="dlq")
    a0, doomed, b0, a1, b1 = (str(uuid.uuid4()) for _ in range(5))
    for event_id in (a0, doomed, b0):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o", 1, partition=0)
    for event_id in (a1, b1):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o", 2, partition=1)
    behaviour = Behaviour(fail_attempts=10**6, fail_only=doomed)
    harness = start(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=3, initial_delay=0.1),
        dead_letter=dlq,
        # The first batch closes when all five are in: under load one partition may start
        # fetching well after the other (0.5 s seen), so a 300 ms wait split them.
        consumer_options={"batch_max_records": 5, "batch_max_ms": 2000.0},
    )
    wait_for(lambda: inbox_state(outboxkit_db_url, b0) == "succeeded", what="b0 after doomed")
    assert inbox_state(outboxkit_db_url, doomed) == "dead"
    # One transaction for the first batch: its marks share the transaction's now().
    assert _finished_at(outboxkit_db_url, a0) == _finished_at(outboxkit_db_url, a1)
    assert _finished_at(outboxkit_db_url, a1) == _finished_at(outboxkit_db_url, b1)
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted([a0, b0, a1, b1])
    harness.wait_outcomes(doomed, b0)
    kinds = [o.kind for o in harness.outcomes if o.event_id == doomed]
    assert kinds == [OutcomeKind.RETRY, OutcomeKind.RETRY, OutcomeKind.DEAD]
    row = inbox_row(outboxkit_db_url, "billing", b0)
    assert row is not None
    assert row["attempts"] == 1  # claimed with the first batch, given back, claimed again
    assert behaviour.calls.index((b0, 1)) > behaviour.calls.index((doomed, 3))
    assert [c for c in behaviour.calls if c[0] == doomed] == [(doomed, 1), (doomed, 2), (doomed, 3)]
    row = inbox_row(outboxkit_db_url, "billing", doomed)
    assert row is not None
    assert row["attempts"] == 3  # the rolled-back optimistic run is not an attempt of its own
    assert [c for c in behaviour.calls if c[0] == a0] == [(a0, 1), (a0, 1)]  # ran twice, once
    assert len(read_topic(outboxkit_kafka_bootstrap, dlq, expect=1)) == 1
    labels = {"consumer": "billing", "reason": "rolled_back"}
    reruns = harness.metrics.registry.get_sample_value("outboxkit_inbox_batch_reruns_total", labels)
    assert reruns == 1  # the first batch's optimistic run (doomed's retries are takeovers: alone)


def test_a_handler_rolling_back_its_session_in_a_batch_loses_no_earlier_effect(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """``session.rollback()`` inside a batch ends the whole transaction, not the handler's
    savepoint: the earlier handlers' writes are gone, so the batch must not mark them succeeded;
    it runs again one event at a time and every event's effect happens exactly once."""
    topic = outboxkit_topic()
    a, undoing, b = (str(uuid.uuid4()) for _ in range(3))
    for event_id in (a, undoing, b):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o", 1)
    behaviour = Behaviour(rollback_in={undoing})
    harness = start([topic], behaviour, consumer_options={"batch_max_ms": 300.0})
    wait_for(
        lambda: all(inbox_state(outboxkit_db_url, e) == "succeeded" for e in (a, undoing, b)),
        what="all three succeeded",
    )
    labels = {"consumer": "billing", "reason": "one_by_one"}
    fallbacks = harness.metrics.registry.get_sample_value(
        "outboxkit_inbox_batch_reruns_total", labels
    )
    assert fallbacks == 1  # the batch ended by the handler's rollback, then one at a time
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted([a, undoing, b])
    for event_id in (a, undoing, b):  # the batch's claims were given back: one attempt each
        row = inbox_row(outboxkit_db_url, "billing", event_id)
        assert row is not None
        assert row["attempts"] == 1


def test_a_handler_swallowing_a_database_error_in_a_batch_fails_alone(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Batch a, swallower, b (one partition): the swallower catches a database error and
    returns, leaving the transaction aborted. It is found out right after it returns: it fails
    (retried, then dead) alone; a commits once, b runs after it; no effect is lost or doubled."""
    topic = outboxkit_topic()
    a, swallower, b = (str(uuid.uuid4()) for _ in range(3))
    for event_id in (a, swallower, b):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o", 1)
    behaviour = Behaviour(sql={swallower: text("SELECT 1/0")}, swallow_sql_errors=True)
    start(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=2, initial_delay=0.1),
        dead_letter=outboxkit_topic(prefix="dlq"),
        consumer_options={"batch_max_ms": 300.0},
    )
    wait_for(lambda: inbox_state(outboxkit_db_url, b) == "succeeded", what="b after the swallower")
    assert inbox_state(outboxkit_db_url, a) == "succeeded"
    row = inbox_row(outboxkit_db_url, "billing", swallower)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("dead", 2)
    assert "aborted" in row["last_error"]
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted([a, b])


@pytest.mark.parametrize("statement", ["ROLLBACK", "COMMIT"])
def test_a_handler_ending_the_batchs_transaction_with_sql_fails_alone(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    statement: str,
) -> None:
    """Batch a, ender, b (one partition): ender sends ROLLBACK or COMMIT as SQL, behind the
    session's back. It is refused before it is sent (HandlerCommitError): ender fails (retried,
    then dead) alone; a and b apply once. Before, a ROLLBACK lost a's effect while a was marked
    succeeded (the marks ran in a new transaction), and a COMMIT made a's effect durable before
    its mark, so the batch's rerun applied it again."""
    topic = outboxkit_topic()
    a, ender, b = (str(uuid.uuid4()) for _ in range(3))
    for event_id in (a, ender, b):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o", 1)
    start(
        [topic],
        Behaviour(sql={ender: text(statement)}),
        policy=RetryPolicy(max_attempts=2, initial_delay=0.1),
        dead_letter=outboxkit_topic(prefix="dlq"),
        consumer_options={"batch_max_ms": 300.0},
    )
    wait_for(lambda: inbox_state(outboxkit_db_url, b) == "succeeded", what="b after the ender")
    assert inbox_state(outboxkit_db_url, a) == "succeeded"
    row = inbox_row(outboxkit_db_url, "billing", ender)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("dead", 2)
    assert "HandlerCommitError" in row["last_error"]
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted([a, b])


class _Keyed(DeclarativeBase):
    pass


class _Key(_Keyed):
    """An ORM row with a unique key: a second one with the same key fails at the flush."""

    __tablename__ = "orm_key"
    __table_args__ = {"schema": "public"}  # noqa: RUF012
    key: Mapped[str] = mapped_column(primary_key=True)


def test_an_orm_flush_failing_in_a_batch_is_its_handlers_alone(
    start: Start,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Batch a, clash, b (one partition): clash adds an ORM row with a's key. The flush after
    its handler fails, so the failure is clash's own: it goes dead alone; a's and b's rows
    commit once, and b (after the failure) runs only once."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS public.orm_key (key text PRIMARY KEY)")
    topic = outboxkit_topic()
    a, clash, b = (str(uuid.uuid4()) for _ in range(3))
    for event_id in (a, clash, b):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o", 1)
    rows = {a: lambda: _Key(key=a), clash: lambda: _Key(key=a), b: lambda: _Key(key=b)}
    behaviour = Behaviour(add_in=rows)
    start(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=1),
        dead_letter=outboxkit_topic(prefix="dlq"),
        consumer_options={"batch_max_ms": 300.0},
    )
    wait_for(lambda: inbox_state(outboxkit_db_url, b) == "succeeded", what="b after the clash")
    assert (inbox_state(outboxkit_db_url, a), inbox_state(outboxkit_db_url, clash)) == (
        "succeeded",
        "dead",
    )
    keys = fetch(outboxkit_db_url, "SELECT key FROM public.orm_key WHERE key IN (%s, %s)", (a, b))
    assert sorted(k[0] for k in keys) == sorted([a, b])
    assert [c for c in behaviour.calls if c[0] == b] == [(b, 1)]


def test_cancel_of_one_event_of_a_batch(
    start: Start,
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Batch a, slow, b (one partition): slow is cancelled while its handler runs. Its savepoint
    rolls back, a commits, the row stays cancelled, and b (held behind it) runs afterwards."""
    topic = outboxkit_topic()
    a, slow, b = (str(uuid.uuid4()) for _ in range(3))
    for event_id in (a, slow, b):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o", 1)
    behaviour = Behaviour(wait_until_lost=True, wait_only=slow)
    harness = start([topic], behaviour, lease_seconds=0.6, consumer_options={"batch_max_ms": 300.0})
    wait_for(lambda: inbox_state(outboxkit_db_url, slow) == "processing", what="slow claimed")
    # One batch: the three were claimed by one statement, and a's success waits for the batch's
    # commit (one event at a time, a would have succeeded before slow was claimed).
    claimed = fetch(
        outboxkit_db_url,
        "SELECT count(*), count(DISTINCT created_at) FROM outboxkit.inbox_message"
        " WHERE consumer = 'billing' AND event_id IN (%s, %s, %s)",
        (a, slow, b),
    )
    assert claimed == [(3, 1)], claimed
    assert inbox_state(outboxkit_db_url, a) == "processing"
    engine = create_engine(sa_url)
    try:
        assert cancel_event(engine, "billing", slow, reason="stop it").cancelled
    finally:
        engine.dispose()
    wait_for(lambda: inbox_state(outboxkit_db_url, b) == "succeeded", what="b after the cancel")
    assert inbox_state(outboxkit_db_url, a) == "succeeded"
    row = inbox_row(outboxkit_db_url, "billing", slow)
    assert row is not None
    assert (row["state"], row["last_error"], row["lease_lost_count"]) == ("cancelled", "stop it", 1)
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted([a, b])
    harness.wait_outcomes(a, slow, b)
    kinds = {o.event_id: o.kind for o in harness.outcomes}
    assert kinds == {
        a: OutcomeKind.SUCCEEDED,
        slow: OutcomeKind.CANCELLED,
        b: OutcomeKind.SUCCEEDED,
    }
    assert [c for c in behaviour.calls if c[0] == slow] == [(slow, 1)]
