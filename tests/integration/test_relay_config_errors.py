"""A Kafka client the settings cannot build is a configuration error: waiting cannot fix it.
In exactly-once mode the start-up's checkpoint reader met it first; in at-least-once mode the
first producer did, inside a shard's session, which backed off and retried it for ever while
holding the lease. Now the relay stops, in one line, in both modes, when no producer of the
shard ever started (later the same error is retried: a certificate rotated in place)."""

from __future__ import annotations

import asyncio

import pytest

from outboxkit.errors import ConfigurationError
from outboxkit.relay.runner import Relay
from outboxkit.settings import load_settings
from tests.relay_support import insert_rows, payloads, relay_settings, set_shard_count

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", ["at_least_once", "exactly_once"])
@pytest.mark.parametrize("client", ["confluent", "aiokafka"])
async def test_a_kafka_client_that_cannot_be_built_stops_the_relay(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, mode: str, client: str
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    insert_rows(outboxkit_db_url, "t", payloads("k", 1))
    base = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, mode=mode, client=client)
    settings = load_settings(
        overrides={
            "database": {"url": outboxkit_db_url},
            "kafka": {
                "bootstrap": outboxkit_kafka_bootstrap,
                "client": client,
                "security_protocol": "SSL",
                "ssl_ca_location": "/nonexistent/ca.pem",
            },
            "relay": base.relay.model_dump(),
        }
    )
    relay = Relay(settings)
    with pytest.raises(ConfigurationError, match=r"(?i)ssl|tls"):
        await asyncio.wait_for(relay.run(), timeout=60)
