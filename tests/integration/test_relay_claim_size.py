"""Adaptive claim size: a backlog goes out in grown claims, a lone row still goes out alone."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.relay_support import (
    KAFKA_CLIENTS,
    assert_exactly_once_in_order,
    consume,
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
    set_shard_count,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_backlog_drains_in_grown_claims_and_an_idle_row_goes_alone(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    topic = outboxkit_topic(partitions=3)
    set_shard_count(outboxkit_db_url, 1)
    expected = [row for n in range(6) for row in payloads(f"k{n}", 50)]
    insert_rows(outboxkit_db_url, topic, expected)
    settings = relay_settings(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        client=client,
        batch_size=5,
        max_batch_size=40,
        transaction_max_rows=100,
    )
    async with running_relay(settings) as relay:
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 300}, what="backlog published"
        )
        publisher = relay.workers[0]._publisher
        stats = publisher.stats
        # 5, 10, 20, 40, 40, ...: far fewer claims than 300 / 5 = 60, none above the setting.
        assert stats.largest_claim == 40
        assert stats.claims <= 15
        assert publisher.limit == 5  # the last claim came back short: back to batch_size
        before = (stats.transactions, stats.rows)
        lone = payloads("lone", 1)
        insert_rows(outboxkit_db_url, topic, lone)
        expected += lone
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 301}, what="lone row published"
        )
        await wait_for_async(lambda: stats.rows == before[1] + 1, what="its transaction counted")
        assert stats.transactions == before[0] + 1  # a transaction of its own, at once
    received = consume(outboxkit_kafka_bootstrap, topic, expect=len(expected))
    assert_exactly_once_in_order(received, expected)
