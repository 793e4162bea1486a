"""A database with an ``idle_session_timeout`` shorter than the relay's quiet spells (``ALTER
DATABASE .. SET idle_session_timeout``, which operators set against leaked sessions): the server
ends a connection of the relay that waits longer than that between statements.

The lease connection (renewals every ``lease_ttl / 3``) and the status sampler's (a sample
every interval) are replaced before use when the server ended them while idle
(``ended_while_idle``, as the engines' pools do). Before, every renewal failed once ("lease
renewal ... errored", retried a second later) and every sample failed ("status sampling
failed"), at each interval.
"""

from __future__ import annotations

import logging

import psycopg
import pytest
from psycopg import sql

from outboxkit.relay.metrics import RelayMetrics
from tests.integration.test_relay_status_sampler import (
    _FILL,
    _sampling,
    _series,
    _take_lease,
)
from tests.relay_support import relay_settings, running_relay, set_shard_count
from tests.support.db_names import database_of
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

IDLE_TIMEOUT_MS = 600


def _idle_timeout(db_url: str, ms: int) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET idle_session_timeout = {}").format(
                sql.Identifier(database_of(db_url)), sql.Literal(ms)
            )
        )


class CountedSamples(RelayMetrics):
    """The relay's metrics, counting the status sampler's successful samples."""

    samples = 0

    def sampled(self, paused: bool) -> None:
        super().sampled(paused)
        self.samples += 1


@pytest.fixture
def idle_timeout_db_url(outboxkit_db_url: str) -> str:
    _idle_timeout(outboxkit_db_url, IDLE_TIMEOUT_MS)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        # A paused group: leases are taken and renewed, no Kafka producer is needed.
        conn.execute(
            "INSERT INTO outboxkit.relay_control (relay_group, paused) VALUES ('default', true)"
        )
    with psycopg.connect(outboxkit_db_url) as conn:
        assert conn.execute("SHOW idle_session_timeout").fetchone() == (f"{IDLE_TIMEOUT_MS}ms",)
    set_shard_count(outboxkit_db_url, 1)
    return outboxkit_db_url


async def test_renewals_and_samples_outlive_the_servers_idle_session_timeout(
    idle_timeout_db_url: str, outboxkit_kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Renewals every 2 s and samples every 1 s: both connections sit idle past 0.6 s each time
    # (the paused shard's data connection checks the pause every 0.1 s).
    settings = relay_settings(
        idle_timeout_db_url, outboxkit_kafka_bootstrap, lease_ttl=6.0, poll_interval=0.2
    )
    caplog.set_level(logging.INFO, logger="outboxkit.relay")
    metrics = CountedSamples()
    async with running_relay(settings, metrics=metrics) as relay:
        leases = relay.leases
        assert leases is not None
        await wait_for_async(lambda: leases.held == 1, what="the shard held")
        start, opened, sampled = leases.renewals, leases.opened, metrics.samples
        await wait_for_async(lambda: leases.renewals >= start + 3, what="three renewals")
        await wait_for_async(lambda: metrics.samples >= sampled + 3, what="three samples")
        # The server ended the lease connection between renewals; it was replaced each time.
        assert leases.opened >= opened + 2
    failures = [
        r.getMessage()
        for r in caplog.records
        if "lease renewal" in r.getMessage() or "status sampling failed" in r.getMessage()
    ]
    assert failures == []


async def test_a_shard_found_to_need_a_count_is_counted_across_a_reconnect(
    outboxkit_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sampler reads holders, finds a shard whose holder went (to count alone, now), waits,
    and finds its connection ended while idle: the count comes on the new connection. (A first
    version of the reconnect forgot the shard until the next full count, an hour away here.)"""
    _take_lease(outboxkit_db_url, "me")
    _idle_timeout(outboxkit_db_url, 300)
    async with _sampling(outboxkit_db_url, monkeypatch, every=0.6) as (reads, metrics):
        await reads.until_count()
        assert _series(metrics.backlog) == {"0": 10}
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(_FILL, {"rows": 5, "batch": 4, "shard": 0})
            conn.execute("UPDATE outboxkit.relay_lease SET holder = NULL")  # shard 0 released
        await reads.until_count()
        assert reads.only == [None, [0]]
        assert _series(metrics.backlog) == {"0": 15}
