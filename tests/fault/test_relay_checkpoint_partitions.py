"""Partitions added to the checkpoint topic between a kill after the Kafka commit and the takeover.

A shard's checkpoint goes to partition ``shard % partitions``. With 2 shards and a checkpoint
topic of 1 partition, shard 1's checkpoint lies on partition 0; once the topic has 2, shard 1's
partition is 1. The successor must still find the checkpoint the killed relay wrote with the old
count (else it sends the committed batch again: duplicates for a read_committed reader), and a
checkpoint it writes with the new count must win over the stale one left on partition 0.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from outboxkit.relay.checkpoint import CHECKPOINT_TOPIC_CONFIG
from tests.fault.kill_support import KillRun
from tests.relay_support import (
    KAFKA_CLIENTS,
    ONE_CLAIM,
    SCHEMA,
    RelayProcess,
    insert_rows,
    payloads,
    row_states,
    set_shard_count,
)

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]


def _keys_of_shard(db_url: str, shard: int, count: int, shards: int) -> list[str]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        found = [
            key
            for n in range(200)
            if (key := f"k{n}")
            and conn.execute(
                f"SELECT {SCHEMA}.outbox_shard(%s, gen_random_uuid(), %s)", (key, shards)
            ).fetchone()
            == (shard,)
        ]
    return found[:count]


def _add_partitions(bootstrap: str, topic: str, total: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, total)]).values():
        future.result(30)


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_partitions_added_to_the_checkpoint_topic_hide_no_checkpoint(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    client: str,
) -> None:
    topic = outboxkit_topic(partitions=2)
    checkpoints = outboxkit_topic("cp", partitions=1, config=dict(CHECKPOINT_TOPIC_CONFIG))
    set_shard_count(outboxkit_db_url, 2)
    keys = _keys_of_shard(outboxkit_db_url, 1, 3, 2)  # only shard 1 publishes: it is killed
    expected = [row for key in keys for row in payloads(key, 2)]
    insert_rows(outboxkit_db_url, topic, expected)
    run = KillRun(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        processes,
        client,
        ["--batch-size", "10", "--mode", "exactly_once"],
        {**ONE_CLAIM, "OUTBOXKIT_RELAY_CHECKPOINT_TOPIC": checkpoints},
    )
    victim = run.killed_at("after_kafka_commit:1")  # shard 1's checkpoint on partition 0 of 1
    assert row_states(outboxkit_db_url) == {"pending": len(expected)}
    _add_partitions(outboxkit_kafka_bootstrap, checkpoints, 2)

    successor = run.finished_exactly_once(victim, topic, expected)
    assert f"reconciled {len(expected)} row(s)" in successor.log(), successor.log()

    # Its checkpoints now go to partition 1; partition 0 keeps the stale one. Killed again after
    # a commit, the next successor must take the newer checkpoint, not the stale one.
    successor.stop()
    more = [row for key in keys for row in payloads(key, 2, start=2)]
    insert_rows(outboxkit_db_url, topic, more)
    victim = run.killed_at("after_kafka_commit:1")
    successor = run.finished_exactly_once(victim, topic, expected + more)
    assert f"reconciled {len(more)} row(s)" in successor.log(), successor.log()
