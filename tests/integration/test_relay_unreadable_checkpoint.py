"""A checkpoint the relay cannot read holds its shard with a clear, typed reason until fixed.

Without the last committed checkpoint the rows of that transaction cannot be told apart, so
publishing would risk duplicates: the shard retries with back-off and says why, the process
keeps running, and no row is lost (each stays pending).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from confluent_kafka import Producer

from outboxkit.relay.checkpoint import CHECKPOINT_TOPIC_CONFIG, checkpoint_key
from tests.relay_support import (
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration


async def test_an_unreadable_checkpoint_holds_the_shard_and_says_why(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = outboxkit_topic(partitions=1)
    checkpoints = outboxkit_topic("cp", partitions=1, config=dict(CHECKPOINT_TOPIC_CONFIG))
    producer = Producer({"bootstrap.servers": outboxkit_kafka_bootstrap})
    hostile = b'{"token": 1, "ids": [1], "event_ids": ["not-a-uuid"]}'
    producer.produce(checkpoints, hostile, key=checkpoint_key("default", 0), partition=0)
    assert producer.flush(30) == 0
    insert_rows(outboxkit_db_url, topic, payloads("a", 5))
    settings = relay_settings(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        mode="exactly_once",
        checkpoint_topic=checkpoints,
    )
    caplog.set_level(logging.WARNING, logger="outboxkit.relay")
    async with running_relay(settings):
        await wait_for_async(
            lambda: any("is unreadable" in r.getMessage() for r in caplog.records),
            what="the shard saying its checkpoint is unreadable",
        )
        assert row_states(outboxkit_db_url) == {"pending": 5}
        # The remedy docs/failure-modes.md gives: a valid (here empty) checkpoint under the key.
        empty = b'{"token": 0, "ids": [], "event_ids": []}'
        producer.produce(checkpoints, empty, key=checkpoint_key("default", 0), partition=0)
        assert producer.flush(30) == 0
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 5}, what="published after fix"
        )
    [said, *_] = [r.getMessage() for r in caplog.records if "is unreadable" in r.getMessage()]
    assert "PublishError" in said, said
    assert "key 'default/0'" in said, said
    errors = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
