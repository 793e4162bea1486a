"""``outboxkit inbox run`` recovers by itself from a broker outage, a PostgreSQL restart, a
read-only PostgreSQL and terminated database sessions, with both clients: every event's effect
happens once, every inbox row ends ``succeeded`` (an outage never counts against a record), the
process never exits, and an outage does not flood the log."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable

import psycopg
import pytest

from outboxkit.devstack import DevStack
from tests.fault.inbox_workers import Worker
from tests.integration.inbox_support import fetch, headers_for, payload, produce
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]
OUTAGE_SECONDS = 8.0
# What an operator's log may get in the 8 s: the first lines of each kind, not one per attempt
# (aiokafka alone logged 474 lines; a consumer one line a second per partition held for a retry).
MAX_OUTAGE_LINES = 20
# Offsets are committed every second: an outage right after a batch leaves its offsets
# uncommitted, so the records come again after it and must be recognised as duplicates.
FAST = {"OUTBOXKIT_CONSUMER_OFFSET_COMMIT_INTERVAL": "1"}


def _events(bootstrap: str, topic: str, prefix: str, count: int, partitions: int = 1) -> list[str]:
    """``count`` events spread over ``partitions``, in one go each; their event ids."""
    ids = [f"{prefix}-{n}-{uuid.uuid4().hex[:6]}" for n in range(count)]
    for partition in range(partitions):
        mine = list(enumerate(ids))[partition::partitions]
        messages = [(b"k", payload(e, n), headers_for(e)) for n, e in mine]
        produce(bootstrap, topic, messages, partition=partition)
    return ids


def _effect_counts(db_url: str) -> Counter[str]:
    return Counter(row[0] for row in fetch(db_url, "SELECT event_id FROM public.effect"))


def _states(db_url: str) -> Counter[str]:
    rows = fetch(
        db_url,
        "SELECT state, count(*) FROM outboxkit.inbox_message WHERE consumer = 'billing'"
        " GROUP BY state",
    )
    return Counter(dict(rows))


def _all_applied(db_url: str, ids: list[str]) -> bool:
    try:
        return set(_effect_counts(db_url)) >= set(ids)
    except psycopg.OperationalError:  # PostgreSQL still coming back
        return False


def _assert_each_once(db_url: str, ids: list[str], worker: Worker) -> None:
    counts = _effect_counts(db_url)
    assert set(counts) == set(ids), worker.output()
    assert set(counts.values()) == {1}, [e for e, n in counts.items() if n > 1]
    assert _states(db_url) == Counter({"succeeded": len(ids)}), worker.output()
    assert worker.running(), worker.output()  # recovered by itself, never exited
    assert "Traceback" not in worker.output(tail=1_000_000), worker.output()


def _caught_up(
    db_url: str, bootstrap: str, topic: str, ids: list[str], worker: Worker, partitions: int = 1
) -> None:
    """Events sent after the fault are applied too, and every event's effect happened once."""
    ids += _events(bootstrap, topic, "after", 20, partitions)
    wait_for(lambda: _all_applied(db_url, ids), timeout=180, what="the consumer caught up")
    _assert_each_once(db_url, ids, worker)


def _consuming(
    spawn: Callable[..., Worker], db_url: str, bootstrap: str, topics: TopicFactory
) -> tuple[Worker, str, list[str]]:
    """A consumer of a topic of four partitions (four held for a retry at once), its first
    events applied: the worker, the topic and their ids."""
    topic = topics(partitions=4)
    worker = spawn(topic, group=f"g-{uuid.uuid4().hex[:8]}", extra_env=FAST)
    ids = _events(bootstrap, topic, "before", 20, partitions=4)
    wait_for(lambda: _all_applied(db_url, ids), what="the first events applied")
    return worker, topic, ids


def _outage_ended_in_log(worker: Worker) -> None:
    wait_for(
        lambda: "the database works again after" in worker.output(),
        timeout=30,
        what="the outage's end in the log, 5 s after its last line",
    )


def _lines_between(worker: Worker, start: int, end: int) -> list[str]:
    return worker.log.read_bytes()[start:end].decode(errors="replace").splitlines()


def test_inbox_run_rides_out_a_broker_outage(
    spawn: Callable[..., Worker],
    outboxkit_stack: DevStack,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    if outboxkit_stack.kafka is None:
        pytest.skip("external Kafka: cannot stop it")
    topic = outboxkit_topic()
    worker = spawn(topic, group=f"g-{uuid.uuid4().hex[:8]}", extra_env=FAST)
    ids = _events(outboxkit_kafka_bootstrap, topic, "before", 20)
    wait_for(lambda: _all_applied(outboxkit_db_url, ids), what="the first events applied")
    ids += _events(outboxkit_kafka_bootstrap, topic, "racing", 200)  # the stop lands mid-way
    wait_for(lambda: _effect_counts(outboxkit_db_url).total() > 20, what="the consumer busy")
    before = worker.log.stat().st_size  # the lines of the stop itself count too
    outboxkit_stack.kafka.stop()
    try:
        time.sleep(OUTAGE_SECONDS)  # the outage itself (the scenario, not a synchronisation)
        assert worker.running(), worker.output()
        during = _lines_between(worker, before, worker.log.stat().st_size)
    finally:
        outboxkit_stack.kafka.start()
    _caught_up(outboxkit_db_url, outboxkit_kafka_bootstrap, topic, ids, worker)
    assert len(during) <= MAX_OUTAGE_LINES, "\n".join(during[-40:])


def test_inbox_run_rides_out_a_postgres_restart(
    spawn: Callable[..., Worker],
    outboxkit_stack: DevStack,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    if outboxkit_stack.postgres is None:
        pytest.skip("external PostgreSQL: cannot stop it")
    worker, topic, ids = _consuming(
        spawn, outboxkit_db_url, outboxkit_kafka_bootstrap, outboxkit_topic
    )
    before = worker.log.stat().st_size  # the lines of the stop itself count too
    outboxkit_stack.postgres.stop()
    try:
        ids += _events(outboxkit_kafka_bootstrap, topic, "during", 20, partitions=4)
        time.sleep(OUTAGE_SECONDS)  # the outage itself (the scenario, not a synchronisation)
        assert worker.running(), worker.output()
        during = _lines_between(worker, before, worker.log.stat().st_size)
    finally:
        outboxkit_stack.postgres.start()
    _caught_up(outboxkit_db_url, outboxkit_kafka_bootstrap, topic, ids, worker, partitions=4)
    assert during, "the consumer did not notice the database was away"
    assert len(during) <= MAX_OUTAGE_LINES, "\n".join(during[-40:])
    _outage_ended_in_log(worker)


def test_inbox_run_rides_out_a_read_only_database(
    spawn: Callable[..., Worker],
    outboxkit_stack: DevStack,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """A server that answers but takes no writes (a replica, ``default_transaction_read_only``,
    a full disk) is the database's state too: no record is given up for it (it used to be
    after ``max_unexpected_errors`` refusals: rejected and dead, its effect never applied) and
    its lines are rate-limited."""
    if outboxkit_stack.postgres is None:
        pytest.skip("external PostgreSQL: cannot make it read-only")
    worker, topic, ids = _consuming(
        spawn, outboxkit_db_url, outboxkit_kafka_bootstrap, outboxkit_topic
    )
    before = worker.log.stat().st_size
    with outboxkit_stack.postgres.read_only():
        ids += _events(outboxkit_kafka_bootstrap, topic, "during", 20, partitions=4)
        wait_for(
            lambda: "read-only transaction" in worker.output(),
            what="the consumer refused a write",
        )
        time.sleep(OUTAGE_SECONDS)  # the outage itself (the scenario, not a synchronisation)
        assert worker.running(), worker.output()
        during = _lines_between(worker, before, worker.log.stat().st_size)
    _caught_up(outboxkit_db_url, outboxkit_kafka_bootstrap, topic, ids, worker, partitions=4)
    assert not any("giving" in line for line in during), "\n".join(during)
    assert len(during) <= MAX_OUTAGE_LINES, "\n".join(during[-40:])
    assert not fetch(outboxkit_db_url, "SELECT reason FROM outboxkit.inbox_rejection")
    _outage_ended_in_log(worker)


def test_inbox_run_rides_out_terminated_sessions(
    spawn: Callable[..., Worker],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    ids = _events(outboxkit_kafka_bootstrap, topic, "backlog", 3000)
    worker = spawn(topic, group=f"g-{uuid.uuid4().hex[:8]}", extra_env=FAST)
    wait_for(lambda: _effect_counts(outboxkit_db_url).total() > 0, what="the consumer busy")
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        ended = conn.execute(
            "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'outboxkit-inbox-%%'"
        ).fetchall()
    # The consumer's sessions carry its name (the claims' and the handlers' pool).
    assert set(ended) == {("outboxkit-inbox-billing", True)}, ended
    assert _effect_counts(outboxkit_db_url).total() < len(ids), "the backlog was already done"
    _caught_up(outboxkit_db_url, outboxkit_kafka_bootstrap, topic, ids, worker)
