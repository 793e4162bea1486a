"""The checkpoint topic deleted while an exactly-once relay runs: the shard creates it again.

Before, every checkpoint sent to the deleted topic failed the transaction and every takeover
failed with "it was deleted after this relay started (a restart creates it again)": the shard
published nothing until someone restarted the process. Now the takeover creates the topic again
(with an ERROR line saying what may be sent twice) and publishing goes on, each row once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient

from outboxkit.relay.checkpoint import CHECKPOINT_TOPIC_CONFIG
from tests.relay_support import (
    KAFKA_CLIENTS,
    assert_exactly_once_in_order,
    consume,
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration


def _delete_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics([topic]).values():
        future.result(30)


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_deleted_checkpoint_topic_is_created_again_while_running(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
    client: str,
) -> None:
    topic = outboxkit_topic(partitions=1)
    checkpoints = outboxkit_topic("cp", partitions=1, config=dict(CHECKPOINT_TOPIC_CONFIG))
    before, after = payloads("a", 5), payloads("a", 5, start=5)
    settings = relay_settings(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        client=client,
        mode="exactly_once",
        checkpoint_topic=checkpoints,
        kafka_timeout=5.0,  # the send to the deleted topic fails within it
    )
    caplog.set_level(logging.WARNING, logger="outboxkit.relay")
    async with running_relay(settings):
        insert_rows(outboxkit_db_url, topic, before)
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 5}, what="the first rows"
        )
        _delete_topic(outboxkit_kafka_bootstrap, checkpoints)
        insert_rows(outboxkit_db_url, topic, after)
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 10},
            what="the rows written after the deletion published",
            within=120,
        )
    assert_exactly_once_in_order(
        consume(outboxkit_kafka_bootstrap, topic, expect=10), before + after
    )
    said = [
        r.getMessage()
        for r in caplog.records
        if "was deleted while the relay ran" in r.getMessage()
    ]
    assert said, "no line said the checkpoint topic was created again"
