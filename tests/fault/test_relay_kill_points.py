"""SIGKILL the relay process at each fault point: nothing lost, no duplicate, per-key order kept.

(a) after claiming, before producing; (b) after producing, before the Kafka commit; (c) after the
Kafka commit, before the database mark; with one claim per Kafka transaction and with three
(then also between two claims of one open transaction). A second relay process then finishes
the work. A ``read_committed`` consumer must see every row exactly once, in insertion order per
key.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from tests.relay_support import (
    KAFKA_CLIENTS,
    ONE_CLAIM,
    THREE_CLAIMS,
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
    common = ["--batch-size", "10", "--mode", "exactly_once"]
    victim = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        common,
        env={**settings, "OUTBOXKIT_FAULT": f"{point}:3"},
        client=client,
    )
    processes.append(victim.start())
    assert victim.wait_exit(120) == -signal.SIGKILL, victim.log()
    assert f"fault point {point}" in victim.log()
    states = row_states(outboxkit_db_url)
    # One or two transactions went through before the kill; the second one's mark may still
    # have been running (it overlaps the next send), in which case the successor reconciles it.
    assert states.get("published", 0) in (rows_per_transaction, 2 * rows_per_transaction), states
    successor = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        common,
        env=settings,
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
    common = ["--batch-size", "10", "--mode", "at_least_once"]
    victim = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        common,
        env={**ONE_CLAIM, "OUTBOXKIT_FAULT": "after_kafka_commit:2"},
        client=client,
    )
    processes.append(victim.start())
    assert victim.wait_exit(120) == -signal.SIGKILL, victim.log()
    processes.append(
        RelayProcess(
            outboxkit_db_url, outboxkit_kafka_bootstrap, common, env=ONE_CLAIM, client=client
        ).start()
    )
    wait_for(lambda: row_states(outboxkit_db_url) == {"published": 30}, timeout=120)
    received = consume(outboxkit_kafka_bootstrap, topic, expect=40)
    values = [r.value for r in received]
    assert set(values) == {v for _, v in expected}  # nothing lost
    assert len(values) == 40  # the second batch (10 rows) arrived twice
    # Order per key still holds for the last copy of each message.
    last_seen = {v: i for i, v in enumerate(values)}
    assert sorted(last_seen, key=last_seen.__getitem__) == [v for _, v in expected]
