"""SIGKILL the relay process at each fault point: nothing lost, no duplicate, per-key order kept.

(a) after claiming, before producing; (b) after producing, before the Kafka commit; (c) after the
Kafka commit, before the database mark; with one claim per Kafka transaction and with three
(then also between two claims of one open transaction). A second relay process then finishes
the work. A ``read_committed`` consumer must see every row exactly once, in insertion order per
key.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.fault.kill_support import KillRun
from tests.relay_support import (
    KAFKA_CLIENTS,
    ONE_CLAIM,
    THREE_CLAIMS,
    RelayProcess,
    consume,
    insert_rows,
    payloads,
    row_states,
    set_shard_count,
)

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]


CASES = [
    *(
        pytest.param(point, 10, ONE_CLAIM, id=f"{point}-one-claim")
        for point in ("after_claim", "after_produce", "after_kafka_commit")
    ),
    # Three claims per transaction: the second transaction open with one claim sent (the first
    # one marked); the third committed, its marks not written.
    *(
        pytest.param(point, 30, THREE_CLAIMS, id=f"{point}-three-claims")
        for point in ("between_claims", "after_kafka_commit")
    ),
]


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
@pytest.mark.parametrize(("point", "rows_per_transaction", "settings"), CASES)
def test_kill_point_loses_and_duplicates_nothing(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    point: str,
    rows_per_transaction: int,
    settings: dict[str, str],
    client: str,
) -> None:
    topic = outboxkit_topic(partitions=2)
    set_shard_count(outboxkit_db_url, 1)
    expected = payloads("a", 40) + payloads("b", 40) + payloads("c", 40)
    insert_rows(outboxkit_db_url, topic, expected)
    run = KillRun(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        processes,
        client,
        ["--batch-size", "10", "--mode", "exactly_once"],
        settings,
    )
    victim = run.killed_at(f"{point}:3")
    states = row_states(outboxkit_db_url)
    # One or two transactions went through before the kill; the second one's mark may still
    # have been running (it overlaps the next send), in which case the successor reconciles it.
    assert states.get("published", 0) in (rows_per_transaction, 2 * rows_per_transaction), states
    successor = run.finished_exactly_once(victim, topic, expected)
    if point == "after_kafka_commit":
        reconciled = f"reconciled {rows_per_transaction} row(s)"
        assert reconciled in successor.log(), successor.log()
    elif point != "after_claim":
        assert "reconciled" not in successor.log(), successor.log()


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_at_least_once_mode_loses_nothing_but_may_duplicate_after_kafka_ack(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    client: str,
) -> None:
    """The documented difference: without transactions, (c) re-sends the acknowledged batch."""
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    expected = payloads("a", 30)
    insert_rows(outboxkit_db_url, topic, expected)
    run = KillRun(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        processes,
        client,
        ["--batch-size", "10", "--mode", "at_least_once"],
        ONE_CLAIM,
    )
    run.killed_at("after_kafka_commit:2")
    run.successor()
    run.wait_all_published(30)
    received = consume(outboxkit_kafka_bootstrap, topic, expect=40)
    values = [r.value for r in received]
    assert set(values) == {v for _, v in expected}  # nothing lost
    assert len(values) == 40  # the second batch (10 rows) arrived twice
    # Order per key still holds for the last copy of each message.
    last_seen = {v: i for i, v in enumerate(values)}
    assert sorted(last_seen, key=last_seen.__getitem__) == [v for _, v in expected]
