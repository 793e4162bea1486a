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
from tests.relay_support import relay_settings, running_relay, set_shard_count
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

IDLE_TIMEOUT_MS = 700


class CountedSamples(RelayMetrics):
    """The relay's metrics, counting the status sampler's successful samples."""

    samples = 0

    def sampled(self, paused: bool) -> None:
        super().sampled(paused)
        self.samples += 1


@pytest.fixture
def idle_timeout_db_url(outboxkit_db_url: str) -> str:
    database = outboxkit_db_url.rsplit("/", 1)[1]
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET idle_session_timeout = {}").format(
                sql.Identifier(database), sql.Literal(IDLE_TIMEOUT_MS)
            )
        )
        # A paused group: leases are taken and renewed, no Kafka producer is needed.
        conn.execute(
            "INSERT INTO outboxkit.relay_control (relay_group, paused) VALUES ('default', true)"
        )
    with psycopg.connect(outboxkit_db_url) as conn:
        assert conn.execute("SHOW idle_session_timeout").fetchone() == ("700ms",)
    set_shard_count(outboxkit_db_url, 1)
    return outboxkit_db_url


async def test_renewals_and_samples_outlive_the_servers_idle_session_timeout(
    idle_timeout_db_url: str, outboxkit_kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Renewals every 2 s and samples every 1 s: both connections sit idle past 0.7 s each time.
    settings = relay_settings(idle_timeout_db_url, outboxkit_kafka_bootstrap, lease_ttl=6.0)
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
