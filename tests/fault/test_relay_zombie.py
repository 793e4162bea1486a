"""Fencing on both sides, and exactly one active holder per shard.

Zombie: relay A freezes itself (SIGSTOP at a fault point) in the middle of a Kafka transaction
of several claims, past its lease; relay B takes over and publishes everything; A is resumed
(SIGCONT). A must get no write through: its Kafka commit is fenced by B's
``init_transactions``, its database writes fail the token check, and it reports *lease lost*
(its own outcome: counted in ``outboxkit_relay_lease_lost_total``, logged as lease lost, never
an error retried) and goes back to standby.
"""

from __future__ import annotations

import re
import signal
import socket
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta

import psycopg
import pytest

from tests.relay_support import (
    KAFKA_CLIENTS,
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _lease_lost_by_reason(port: int) -> dict[str, float]:
    """The non-zero series of ``outboxkit_relay_lease_lost_total``, by their reason label."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    series = re.compile(r'outboxkit_relay_lease_lost_total\{reason="(\w+)",shard="0"\} (\S+)')
    counts = {}
    for line in text.splitlines():
        found = series.match(line)
        if found and float(found[2]):
            counts[found[1]] = float(found[2])
    return counts


Lease = tuple[str | None, int, datetime]  # holder, token, renewed_at
LEASE_TTL = timedelta(seconds=3)  # RelayProcess's


def _leases(db_url: str) -> tuple[datetime, dict[int, Lease]]:
    """The database clock, and the leases of shards 0-3 of the default group."""
    with psycopg.connect(db_url) as conn:
        now = conn.execute("SELECT now()").fetchone()
        rows = conn.execute(
            "SELECT shard, holder, token, renewed_at FROM outboxkit.relay_lease"
            " WHERE relay_group = 'default' AND shard < 4"
        ).fetchall()
    assert now is not None
    return now[0], {shard: (holder, token, renewed) for shard, holder, token, renewed in rows}


def _holders(leases: dict[int, Lease]) -> dict[int, tuple[str | None, int]]:
    return {shard: (holder, token) for shard, (holder, token, _) in leases.items()}


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
@pytest.mark.parametrize(
    ("point", "fenced_by", "reasons"),
    [
        # Resumed with its batch not sent yet: the term's check right before the send stops it
        # (its trust deadline passed while it was frozen), unless the renewer's refused renewal
        # saw the takeover first. Its records never reach the producer.
        (
            "before_send",
            r"local trust deadline passed|taken over",
            {"trust_lapsed", "taken_over"},
        ),
        ("after_produce", r"fenced|taken over", {"fenced", "taken_over"}),
        # Resumed before its mark: either the local trust deadline stops it first, or the mark
        # is refused by the token check in SQL (tests/integration/test_relay_lease.py proves
        # that refusal directly).
        (
            "after_kafka_commit",
            r"lost during mark_published|local trust deadline passed",
            {"taken_over", "trust_lapsed"},
        ),
    ],
)
def test_zombie_gets_nothing_through(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    point: str,
    fenced_by: str,
    reasons: set[str],
    client: str,
) -> None:
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    expected = payloads("k", 30) + payloads("j", 30)
    insert_rows(outboxkit_db_url, topic, expected)
    common = ["--batch-size", "10"]
    port = _free_port()
    zombie = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        common,
        env={
            # Two transactions of three claims: the zombie freezes in the second one.
            **THREE_CLAIMS,
            "OUTBOXKIT_FAULT": f"{point}:2:stop",
            "OUTBOXKIT_RELAY_METRICS_PORT": str(port),
        },
        client=client,
    ).start()
    processes.append(zombie)
    wait_for(lambda: f"fault point {point}: SIGSTOP" in zombie.log(), timeout=120, what="freeze")
    assert zombie.proc is not None
    assert zombie.proc.poll() is None
    successor = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        common,
        env=THREE_CLAIMS,
        checkpoint_topic=zombie.checkpoint_topic,
        client=client,
    ).start()
    processes.append(successor)
    wait_for(
        lambda: row_states(outboxkit_db_url) == {"published": len(expected)},
        timeout=120,
        what="the successor publishes everything",
    )
    assert successor.holds()
    with psycopg.connect(outboxkit_db_url) as conn:
        before = conn.execute(
            "SELECT id, published_at FROM outboxkit.outbox_message ORDER BY id"
        ).fetchall()

    zombie.signal(signal.SIGCONT)
    # Logged once the term has ended (its marks abandoned, producers closed, lease released):
    # the zombie is back on standby, where it writes no outbox row.
    wait_for(
        lambda: re.search(r"lease lost on shard 0 .*; back to standby", zombie.log()),
        timeout=60,
        what="zombie reports lease lost, back on standby",
    )
    log = zombie.log()
    assert re.search(fenced_by, log), log
    # Lease lost is its own outcome: counted, and never an (unexpected) error that is retried.
    counted = _lease_lost_by_reason(port)
    assert list(counted.values()) == [1.0], counted
    assert set(counted) <= reasons, counted
    assert "unexpected error" not in log, log
    assert not re.search(r"shard 0: .*retrying in", log), log
    assert "SystemError" not in log, log
    with psycopg.connect(outboxkit_db_url) as conn:
        after = conn.execute(
            "SELECT id, published_at FROM outboxkit.outbox_message ORDER BY id"
        ).fetchall()
    assert after == before  # not one database write from the zombie
    assert successor.holds()
    received = consume(outboxkit_kafka_bootstrap, topic, expect=len(expected))
    assert_exactly_once_in_order(received, expected)  # not one Kafka write from the zombie


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
def test_two_relays_started_at_once_share_shards_with_one_active_each(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    processes: list[RelayProcess],
    client: str,
) -> None:
    topic = outboxkit_topic(partitions=2)
    set_shard_count(outboxkit_db_url, 4)
    expected = [item for key in "abcdefgh" for item in payloads(key, 15)]
    insert_rows(outboxkit_db_url, topic, expected)
    first = RelayProcess(
        outboxkit_db_url, outboxkit_kafka_bootstrap, ["--batch-size", "5"], client=client
    )
    second = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        ["--batch-size", "5"],
        checkpoint_topic=first.checkpoint_topic,
        client=client,
    )
    processes.extend([first.start(), second.start()])
    wait_for(
        lambda: row_states(outboxkit_db_url) == {"published": len(expected)},
        timeout=120,
        what="everything published",
    )
    # Two lease TTLs of steady state by the database clock: every shard's lease renewed that
    # long after, by the same holder with the same token (no flapping, no second holder).
    start, held = _leases(outboxkit_db_url)
    assert sorted(held) == [0, 1, 2, 3], held
    wait_for(
        lambda: all(
            renewed >= start + 2 * LEASE_TTL
            for _, _, renewed in _leases(outboxkit_db_url)[1].values()
        ),
        timeout=60,
        what="two lease TTLs of renewals on every shard",
    )
    assert _holders(_leases(outboxkit_db_url)[1]) == _holders(held)
    activations: dict[int, list[int]] = {}
    for proc in (first, second):
        for shard in re.findall(r"shard (\d+) active with token", proc.log()):
            activations.setdefault(int(shard), []).append(proc.pid)
    assert sorted(activations) == [0, 1, 2, 3], activations
    assert all(len(pids) == 1 for pids in activations.values()), activations
    assert all(any(p.holds(shard) for p in (first, second)) for shard in range(4))
    received = consume(outboxkit_kafka_bootstrap, topic, expect=len(expected))
    assert_exactly_once_in_order(received, expected)
