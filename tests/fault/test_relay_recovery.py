"""The relay recovers by itself from a broker outage, a PostgreSQL restart and a terminated
database session; nothing is lost and (exactly-once mode) nothing is duplicated."""

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlsplit

import psycopg
import pytest

from outboxkit.devstack import DevStack
from tests.relay_support import (
    KAFKA_CLIENTS,
    ONE_CLAIM,
    RelayProcess,
    assert_exactly_once_in_order,
    consume,
    insert_rows,
    payloads,
    row_states,
    set_shard_count,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]
ENV = {"OUTBOXKIT_RELAY_KAFKA_TIMEOUT": "10", "OUTBOXKIT_RELAY_BACKOFF_MAX": "2"}


# A backlog drained in transactions of 10 rows: the fault lands while the relay is busy.
BACKLOG = 3000
DRAINING = {**ENV, "OUTBOXKIT_RELAY_BATCH_SIZE": "10", **ONE_CLAIM}


def _backlog(db_url: str, topic: str, key: str) -> list[tuple[str, bytes]]:
    rows = payloads(key, BACKLOG)
    with psycopg.connect(db_url) as conn:  # one transaction: the relay sees it all at once
        insert_rows(conn, topic, rows)
    return rows


def _mid_drain(db_url: str) -> dict[str, int]:
    """The row states once the relay has published some of the backlog, and not all of it."""
    states: dict[str, int] = wait_for(
        lambda: (s := row_states(db_url)).get("published", 0) > 0 and s.get("pending", 0) > 0 and s,
        timeout=60,
        what="the relay in the middle of the backlog",
    )
    return states


def _insert_retrying(db_url: str, topic: str, rows: list[tuple[str, bytes]]) -> None:
    """The application's write, retried while PostgreSQL is coming back."""
    deadline = time.monotonic() + 60
    while True:
        try:
            insert_rows(db_url, topic, rows)
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_broker_outage_of_20_seconds(
    outboxkit_stack: DevStack,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    client: str,
) -> None:
    if outboxkit_stack.kafka is None:
        pytest.skip("external Kafka: cannot stop it")
    topic = outboxkit_topic(partitions=2)
    set_shard_count(outboxkit_db_url, 2)
    relay = RelayProcess(
        outboxkit_db_url, outboxkit_kafka_bootstrap, env=ENV, client=client
    ).start()
    processes.append(relay)
    expected = payloads("a", 20) + payloads("b", 20)
    insert_rows(outboxkit_db_url, topic, expected)
    wait_for(lambda: row_states(outboxkit_db_url) == {"published": 40}, timeout=60)

    outboxkit_stack.kafka.stop()
    try:
        during = payloads("a", 20, start=20) + payloads("c", 20)
        insert_rows(outboxkit_db_url, topic, during)
        expected += during
        time.sleep(20)  # the outage itself (the scenario, not a synchronisation)
        assert row_states(outboxkit_db_url).get("pending") == 40
    finally:
        outboxkit_stack.kafka.start()
    after = payloads("b", 10, start=20)
    insert_rows(outboxkit_db_url, topic, after)
    expected += after
    wait_for(
        lambda: row_states(outboxkit_db_url) == {"published": len(expected)},
        timeout=180,
        what="relay catches up after the broker is back",
    )
    assert relay.proc is not None
    assert relay.proc.poll() is None  # recovered by itself, never exited
    # The outage was not taken for a bad record (aiokafka's second producer of a shard, which
    # had no metadata of the topic yet, reported it as an unknown topic).
    # A shard that failed says when it works again: at its loop's next turn after the mark that
    # published the last rows, which may come after the rows read as published here.
    wait_for(lambda: "working again with token" in relay.log(), timeout=30, what="working again")
    log = relay.log()
    assert "isolating rows" not in log
    # Each retry during the outage was a term of its own: their lease and term lines are DEBUG
    # (aiokafka logged 24 INFO term lines).
    assert log.count("active with token") <= 4, log
    assert_exactly_once_in_order(
        consume(outboxkit_kafka_bootstrap, topic, expect=len(expected), timeout=120), expected
    )


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_postgres_restart(
    outboxkit_stack: DevStack,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    client: str,
) -> None:
    if outboxkit_stack.postgres is None:
        pytest.skip("external PostgreSQL: cannot restart it")
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    expected = _backlog(outboxkit_db_url, topic, "a")
    relay = RelayProcess(
        outboxkit_db_url, outboxkit_kafka_bootstrap, env=DRAINING, client=client
    ).start()
    processes.append(relay)
    _mid_drain(outboxkit_db_url)
    outboxkit_stack.postgres.restart()
    more = payloads("a", 30, start=BACKLOG)
    _insert_retrying(outboxkit_db_url, topic, more)
    expected += more
    wait_for(
        lambda: row_states(outboxkit_db_url) == {"published": len(expected)},
        timeout=180,
        what="relay recovers after the PostgreSQL restart",
    )
    assert relay.proc is not None
    assert relay.proc.poll() is None
    assert_exactly_once_in_order(
        consume(outboxkit_kafka_bootstrap, topic, expect=len(expected), timeout=120), expected
    )


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_relay_backends_terminated(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    client: str,
) -> None:
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    expected = _backlog(outboxkit_db_url, topic, "k")
    relay = RelayProcess(
        outboxkit_db_url, outboxkit_kafka_bootstrap, env=DRAINING, client=client
    ).start()
    processes.append(relay)
    _mid_drain(outboxkit_db_url)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        sessions = conn.execute(
            "SELECT application_name, pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'outboxkit-relay%%'"
        ).fetchall()
    # The data session of the active term was among them (the standby, listen and sampling
    # sessions, and the lease one, too), and the backlog was not yet drained.
    assert ("outboxkit-relay-0", True) in sessions, sessions
    assert row_states(outboxkit_db_url).get("pending", 0) > 0
    more = payloads("k", 20, start=BACKLOG)
    insert_rows(outboxkit_db_url, topic, more)
    expected += more
    wait_for(
        lambda: row_states(outboxkit_db_url) == {"published": len(expected)},
        timeout=180,
        what="relay recovers from terminated sessions",
    )
    assert relay.proc is not None
    assert relay.proc.poll() is None
    assert "AdminShutdown" in relay.log() or "terminat" in relay.log()
    assert_exactly_once_in_order(
        consume(outboxkit_kafka_bootstrap, topic, expect=len(expected), timeout=120), expected
    )


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_relay_started_while_postgres_is_down_waits_and_then_publishes(
    outboxkit_stack: DevStack,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    client: str,
) -> None:
    """A standby that comes up before its database: it waits with back-off, says for what
    (never the password), and starts publishing once PostgreSQL is back; no traceback."""
    if outboxkit_stack.postgres is None:
        pytest.skip("external PostgreSQL: cannot stop it")
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    expected = payloads("a", 20)
    insert_rows(outboxkit_db_url, topic, expected)
    password = urlsplit(outboxkit_db_url).password
    assert password
    outboxkit_stack.postgres.stop()
    try:
        relay = RelayProcess(
            outboxkit_db_url,
            outboxkit_kafka_bootstrap,
            env={"OUTBOXKIT_RELAY_BACKOFF_MAX": "1"},
            client=client,
        ).start()
        processes.append(relay)
        wait_for(
            lambda: relay.log().count("waiting for PostgreSQL at") >= 3,
            timeout=60,
            what="the relay waits for PostgreSQL, more than once",
        )
        assert relay.proc is not None
        assert relay.proc.poll() is None  # still running
    finally:
        outboxkit_stack.postgres.start()
    wait_for(
        lambda: row_states(outboxkit_db_url) == {"published": len(expected)},
        timeout=120,
        what="the relay publishes once PostgreSQL is back",
    )
    assert_exactly_once_in_order(
        consume(outboxkit_kafka_bootstrap, topic, expect=len(expected)), expected
    )
    log = relay.log()
    assert "Traceback" not in log, log
    assert password not in log, log
