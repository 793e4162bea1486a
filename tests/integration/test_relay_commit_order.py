"""Commit-safe reading: a long-open transaction delays nothing else and is never skipped."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from tests.relay_support import (
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


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_long_open_transaction_is_published_after_it_commits(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    outcome: str,
) -> None:
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, batch_size=5)
    slow = psycopg.connect(outboxkit_db_url)  # T1: inserts first (lowest ids), commits last
    try:
        slow_rows = payloads("slow", 3)
        slow_ids = insert_rows(slow, topic, slow_rows)
        async with running_relay(settings):
            fast_rows = []
            for n in range(10):  # T2..T11 commit while T1 stays open
                rows = payloads(f"fast{n}", 2)
                insert_rows(outboxkit_db_url, topic, rows)
                fast_rows += rows
            await wait_for_async(
                lambda: row_states(outboxkit_db_url) == {"published": 20},
                what="later transactions published while T1 is open",
            )
            if outcome == "commit":
                slow.commit()
                expected_total = 23
            else:
                slow.rollback()
                expected_total = 20
            after = payloads("after", 2)  # no permanent stall either way
            insert_rows(outboxkit_db_url, topic, after)
            await wait_for_async(
                lambda: row_states(outboxkit_db_url) == {"published": expected_total + 2},
                what="T1's rows (if committed) and later rows published",
            )
    finally:
        slow.close()
    received = consume(outboxkit_kafka_bootstrap, topic, expect=expected_total + 2)
    values = [r.value for r in received]
    want = fast_rows + after + (slow_rows if outcome == "commit" else [])
    assert sorted(values) == sorted(v for _, v in want)  # nothing skipped, nothing phantom
    if outcome == "commit":
        assert min(slow_ids) < 4  # T1's ids are the lowest, yet its rows came after T2..T11
        slow_positions = [values.index(v) for _, v in slow_rows]
        assert slow_positions == sorted(slow_positions)
        assert min(slow_positions) > max(values.index(v) for _, v in fast_rows)
