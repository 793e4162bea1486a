"""``outboxkit relay run`` stopped (SIGTERM) while PostgreSQL does not answer: its processes are
frozen, so TCP connections are accepted and nothing is answered on them, as behind a network
partition that sends no reset.

The lease renewal gives up at its interval, its socket shut rather than the statement cancelled
(before: psycopg asked the frozen server to cancel it, and a renewal took 10 s). The statements
in flight at the SIGTERM get the stop's grace (``outboxkit.db.STATEMENT_GRACE_SECONDS``); the
server then does not answer a new connection either, so their connections are closed and no new
one is opened: the relay ends with status 0, without a
traceback. Before, it waited for as long as the server stayed frozen. Once the server answers
again, a new relay publishes the rest: every row exactly once, in order.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import psycopg
import pytest

from outboxkit.devstack import DevStack
from tests.relay_support import (
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
BACKLOG = 3000
# Seconds: the 5 s grace, the 2 s question to the server, the lease's release (bounded by its
# renewal interval) and the close; measured 8.0-8.3 s.
STOPPED_WITHIN = 20.0
RENEWAL_GAVE_UP = "errored: TimeoutError: no answer within 1 s"


def test_sigterm_while_postgres_does_not_answer_ends_the_relay(
    outboxkit_stack: DevStack,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
) -> None:
    if outboxkit_stack.postgres is None:
        pytest.skip("external PostgreSQL: cannot freeze it")
    topic = outboxkit_topic(partitions=2)
    set_shard_count(outboxkit_db_url, 1)
    expected = payloads("a", BACKLOG)
    with psycopg.connect(outboxkit_db_url) as conn:  # one transaction: all pending at once
        insert_rows(conn, topic, expected)
    draining = {"OUTBOXKIT_RELAY_BATCH_SIZE": "10", **ONE_CLAIM}
    relay = RelayProcess(outboxkit_db_url, outboxkit_kafka_bootstrap, env=draining).start()
    processes.append(relay)
    wait_for(
        lambda: (s := row_states(outboxkit_db_url)).get("published", 0) > 0 and s.get("pending"),
        what="the relay in the middle of the backlog",
    )
    outboxkit_stack.postgres.freeze()
    try:
        # Its lease renewal gives up at the renewal interval (1 s here), its socket shut.
        wait_for(lambda: RENEWAL_GAVE_UP in relay.log(), what="a renewal giving up")
        began = time.monotonic()
        relay.signal(signal.SIGTERM)
        code = relay.wait_exit(timeout=120)
        took = time.monotonic() - began
    finally:
        outboxkit_stack.postgres.thaw()
    log = relay.log()
    assert code == 0, log
    assert took < STOPPED_WITHIN, f"{took:.1f} s\n{log}"
    assert "Traceback" not in log, log
    assert "still waiting for PostgreSQL" in log, log
    # No statement was cancelled (psycopg would ask the frozen server to cancel it, and wait).
    assert "query cancellation" not in log, log
    successor = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        env=draining,
        checkpoint_topic=relay.checkpoint_topic,
    ).start()
    processes.append(successor)
    wait_for(
        lambda: row_states(outboxkit_db_url) == {"published": BACKLOG},
        timeout=120,
        what="the successor publishing the rest",
    )
    assert_exactly_once_in_order(
        consume(outboxkit_kafka_bootstrap, topic, expect=BACKLOG), expected
    )
