"""SIGTERM: the relay stops claiming, finishes its batch, releases the lease; a standby takes
over at once (by the release, not by waiting for the lease to expire)."""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from tests.relay_support import (
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
LEASE_TTL = 300.0  # far beyond the wait below: a takeover by expiry cannot pass for a release


def test_sigterm_hands_over_to_standby_within_a_poll_interval(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
) -> None:
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    env = {"OUTBOXKIT_RELAY_LEASE_TTL": str(LEASE_TTL)}
    first = RelayProcess(outboxkit_db_url, outboxkit_kafka_bootstrap, env=env).start()
    processes.append(first)
    wait_for(first.holds, timeout=60, what="first relay active")
    standby = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        env=env,
        checkpoint_topic=first.checkpoint_topic,
    ).start()
    processes.append(standby)
    wait_for(lambda: "starting: shards" in standby.log(), timeout=60, what="standby running")
    expected = payloads("a", 50)
    insert_rows(outboxkit_db_url, topic, expected[:25])
    wait_for(lambda: row_states(outboxkit_db_url) == {"published": 25}, timeout=60)

    first.signal(signal.SIGTERM)
    assert first.wait_exit(60) == 0, first.log()
    wait_for(standby.holds, timeout=60, what="standby takes over")
    assert "released lease of shard 0" in first.log()
    insert_rows(outboxkit_db_url, topic, expected[25:])
    wait_for(lambda: row_states(outboxkit_db_url) == {"published": 50}, timeout=60)
    assert_exactly_once_in_order(consume(outboxkit_kafka_bootstrap, topic, expect=50), expected)
