"""A relay started with fewer producers per shard than the holder before it fences the old
holder's other transactional ids too.

The zombie is a producer on slot 1's transactional id with a transaction open (a holder that
used two producers and stalled inside a commit). A relay with one producer takes the shard
over: the shard's record says two slots may be in use (``relay_producer_slots``), so the
takeover initialises slot 1's id as well and the zombie's commit is refused. Before, only
slot 0 was fenced, the zombie's commit went through and its record reached read_committed
readers next to the successor's own publication of the same rows.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from confluent_kafka import KafkaException, Producer

from outboxkit.relay.runner import slot_transactional_id
from tests.relay_support import (
    KAFKA_CLIENTS,
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


def _slots(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT slots FROM outboxkit.relay_producer_slots"
            " WHERE relay_group = 'default' AND shard = 0"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_takeover_with_fewer_producers_fences_the_slots_it_does_not_use(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    with psycopg.connect(outboxkit_db_url) as conn:  # an earlier holder used two slots
        conn.execute(
            "INSERT INTO outboxkit.relay_producer_slots (relay_group, shard, slots)"
            " VALUES ('default', 0, 2)"
        )
    zombie = Producer(
        {
            "bootstrap.servers": outboxkit_kafka_bootstrap,
            "transactional.id": slot_transactional_id("default", 0, 1),
        }
    )
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie", key=b"z")
    zombie.flush(30)

    expected = payloads("a", 3)
    insert_rows(outboxkit_db_url, topic, expected)
    settings = relay_settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, client=client, producers_per_shard=1
    )
    async with running_relay(settings):
        await wait_for_async(lambda: row_states(outboxkit_db_url) == {"published": 3})
    with pytest.raises(KafkaException) as refused:
        zombie.commit_transaction(30)
    assert refused.value.args[0].fatal() or refused.value.args[0].txn_requires_abort()
    received = consume(outboxkit_kafka_bootstrap, topic, expect=3)
    assert sorted(r.value for r in received) == sorted(v for _, v in expected)
    assert _slots(outboxkit_db_url) == 1  # only its own slot may be in use now
