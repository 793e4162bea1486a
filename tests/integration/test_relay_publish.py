"""The relay publishes committed outbox rows to Kafka, in order per key, in both modes; a
backlog goes out in grown claims, a lone row alone."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
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
@pytest.mark.parametrize("mode", ["exactly_once", "at_least_once"])
async def test_publishes_every_row_once_in_key_order(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    mode: str,
    client: str,
) -> None:
    topic = outboxkit_topic(partitions=3)
    set_shard_count(outboxkit_db_url, 2)
    expected = payloads("a", 30) + payloads("b", 30) + payloads("c", 30)
    insert_rows(outboxkit_db_url, topic, expected, headers={"traceparent": "00-abc-def-01"})
    settings = relay_settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, mode=mode, batch_size=7, client=client
    )
    async with running_relay(settings) as relay:
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 90}, what="all published"
        )
        more = payloads("a", 5, start=30)
        insert_rows(outboxkit_db_url, topic, more)
        expected += more
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 95}, what="late rows published"
        )
        assert sorted(relay.workers) == [0, 1]
    received = consume(outboxkit_kafka_bootstrap, topic, expect=len(expected))
    assert_exactly_once_in_order(received, expected)
    first = received[0]
    assert first.headers["traceparent"] == "00-abc-def-01"
    assert first.headers["event-type"] == "test.event"
    assert first.headers["content-type"] == "application/json"
    assert first.headers["idempotency-key"].startswith("idem-")
    with psycopg.connect(outboxkit_db_url) as conn:
        row = conn.execute(
            "SELECT event_id::text FROM outboxkit.outbox_message WHERE idempotency_key = %s",
            (first.headers["idempotency-key"],),
        ).fetchone()
    assert row is not None
    assert row[0] == first.headers["event-id"]


async def test_delete_mode_removes_published_rows(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    expected = payloads("k", 20)
    insert_rows(outboxkit_db_url, topic, expected)
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, on_publish="delete")
    async with running_relay(settings):
        await wait_for_async(lambda: row_states(outboxkit_db_url) == {}, what="rows deleted")
    assert_exactly_once_in_order(
        consume(outboxkit_kafka_bootstrap, topic, expect=len(expected)), expected
    )


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
