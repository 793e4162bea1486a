"""SIGKILL between the commits of the two producers a shard uses in turn.

Batch b goes out on producer slot b % 2, and slot (b + 1) % 2 begins only after slot b % 2's
commit returned. A kill right before or right after either slot's commit must leave nothing
lost, no duplicate for a ``read_committed`` reader and per-key order kept, once a successor
(which fences both transactional ids and reconciles both slots' checkpoints) has finished.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.fault.kill_support import KillRun
from tests.relay_support import (
    KAFKA_CLIENTS,
    ONE_CLAIM,
    RelayProcess,
    insert_rows,
    payloads,
    row_states,
    set_shard_count,
)

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]
EXACTLY_ONCE = ["--batch-size", "10", "--mode", "exactly_once"]

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
    # One claim per transaction: batch b is transaction b, on slot b % 2.
    two = {"OUTBOXKIT_RELAY_PRODUCERS_PER_SHARD": "2", **ONE_CLAIM}
    run = KillRun(outboxkit_db_url, outboxkit_kafka_bootstrap, processes, client, EXACTLY_ONCE, two)
    victim = run.killed_at(fault)
    # The previous batch's mark is settled before each commit: exactly these rows are marked.
    assert row_states(outboxkit_db_url).get("published", 0) == 10 * marked_batches
    successor = run.finished_exactly_once(victim, topic, expected)
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
    one = {"OUTBOXKIT_RELAY_PRODUCERS_PER_SHARD": "1", **ONE_CLAIM}
    run = KillRun(outboxkit_db_url, outboxkit_kafka_bootstrap, processes, client, EXACTLY_ONCE, one)
    victim = run.killed_at("after_commit_slot0:2")
    successor = run.finished_exactly_once(
        victim, topic, expected, OUTBOXKIT_RELAY_PRODUCERS_PER_SHARD="2"
    )
    assert "reconciled 10 row(s)" in successor.log(), successor.log()


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_a_relay_with_fewer_producers_reconciles_every_slot(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    client: str,
) -> None:
    """A rolling raise of producers_per_shard: a relay with two producers dies after slot 1's
    commit, before its mark, and one still at one producer takes over. It reads slot 1's
    checkpoint too (every slot up to the maximum), so the batch is not sent again; before, it
    read slot 0 only and every row of that batch reached read_committed readers twice."""
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    expected = payloads("a", 30)
    insert_rows(outboxkit_db_url, topic, expected)
    two = {"OUTBOXKIT_RELAY_PRODUCERS_PER_SHARD": "2", **ONE_CLAIM}
    run = KillRun(outboxkit_db_url, outboxkit_kafka_bootstrap, processes, client, EXACTLY_ONCE, two)
    victim = run.killed_at("after_commit_slot1:1")
    successor = run.finished_exactly_once(
        victim, topic, expected, OUTBOXKIT_RELAY_PRODUCERS_PER_SHARD="1"
    )
    assert "reconciled 10 row(s)" in successor.log(), successor.log()
