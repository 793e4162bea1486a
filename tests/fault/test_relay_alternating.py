"""SIGKILL between the commits of the two producers a shard uses in turn.

Batch b goes out on producer slot b % 2, and slot (b + 1) % 2 begins only after slot b % 2's
commit returned. A kill right before or right after either slot's commit must leave nothing
lost, no duplicate for a ``read_committed`` reader and per-key order kept, once a successor
(which fences both transactional ids and reconciles both slots' checkpoints) has finished.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

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

# (fault spec, batches marked before the kill, rows the successor must reconcile)
CASES = [
    ("after_commit_slot1:1", 1, 10),  # batch 1 (slot 1) committed, not marked
    ("after_commit_slot0:2", 2, 10),  # batch 2 (slot 0) committed, slot 1's batch 1 marked
    ("before_commit_slot0:2", 2, 0),  # batch 2 open on slot 0, batch 1 (slot 1) committed
    ("before_commit_slot1:2", 3, 0),  # batch 3 open on slot 1, batch 2 (slot 0) committed
]


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
@pytest.mark.parametrize(("fault", "marked_batches", "reconciled"), CASES)
def test_kill_between_the_two_producers_commits(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    fault: str,
    marked_batches: int,
    reconciled: int,
    client: str,
) -> None:
    topic = outboxkit_topic(partitions=2)
    set_shard_count(outboxkit_db_url, 1)
    expected = payloads("a", 40) + payloads("b", 40) + payloads("c", 40)
    insert_rows(outboxkit_db_url, topic, expected)
    common = ["--batch-size", "10", "--mode", "exactly_once"]
    # One claim per transaction: batch b is transaction b, on slot b % 2.
    two = {"OUTBOXKIT_RELAY_PRODUCERS_PER_SHARD": "2", **ONE_CLAIM}
    victim = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        common,
        env={**two, "OUTBOXKIT_FAULT": fault},
        client=client,
    )
    processes.append(victim.start())
    assert victim.wait_exit(120) == -signal.SIGKILL, victim.log()
    assert f"fault point {fault.split(':')[0]}" in victim.log()
    # The previous batch's mark is settled before each commit: exactly these rows are marked.
    assert row_states(outboxkit_db_url).get("published", 0) == 10 * marked_batches
    successor = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        common,
        env=two,
        checkpoint_topic=victim.checkpoint_topic,
        client=client,
    )
    processes.append(successor.start())
    wait_for(
        lambda: row_states(outboxkit_db_url) == {"published": len(expected)},
        timeout=120,
        what="successor publishes everything",
    )
    received = consume(outboxkit_kafka_bootstrap, topic, expect=len(expected))
    assert_exactly_once_in_order(received, expected)
    if reconciled:
        assert f"reconciled {reconciled} row(s)" in successor.log(), successor.log()
    else:
        assert "reconciled" not in successor.log(), successor.log()


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_upgrade_from_one_producer_to_two_reconciles_slot_zero(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    client: str,
) -> None:
    """Slot 0 keeps the single-producer transactional id and checkpoint key (upgrades work)."""
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    expected = payloads("a", 30)
    insert_rows(outboxkit_db_url, topic, expected)
    common = ["--batch-size", "10", "--mode", "exactly_once"]
    victim = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        common,
        env={
            "OUTBOXKIT_RELAY_PRODUCERS_PER_SHARD": "1",
            "OUTBOXKIT_FAULT": "after_commit_slot0:2",
            **ONE_CLAIM,
        },
        client=client,
    )
    processes.append(victim.start())
    assert victim.wait_exit(120) == -signal.SIGKILL, victim.log()
    successor = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        common,
        env={"OUTBOXKIT_RELAY_PRODUCERS_PER_SHARD": "2", **ONE_CLAIM},
        checkpoint_topic=victim.checkpoint_topic,
        client=client,
    )
    processes.append(successor.start())
    wait_for(lambda: row_states(outboxkit_db_url) == {"published": 30}, timeout=120)
    received = consume(outboxkit_kafka_bootstrap, topic, expect=len(expected))
    assert_exactly_once_in_order(received, expected)
    assert "reconciled 10 row(s)" in successor.log(), successor.log()
