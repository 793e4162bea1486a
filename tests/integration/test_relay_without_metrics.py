"""Without the ``metrics`` extra the relay runs; asking it for a metrics endpoint is one line
naming the extra to install."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.relay_support import (
    RelayProcess,
    insert_rows,
    payloads,
    row_states,
)
from tests.support.blocking import env_without
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def test_relay_publishes_without_prometheus_client(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: Callable[..., str]
) -> None:
    topic = outboxkit_topic()
    insert_rows(outboxkit_db_url, topic, payloads("k", 3))
    relay = RelayProcess(
        outboxkit_db_url, outboxkit_kafka_bootstrap, base_env=env_without("prometheus_client")
    ).start()
    try:
        wait_for(lambda: row_states(outboxkit_db_url) == {"published": 3}, what="published")
    finally:
        relay.stop()


def test_metrics_port_without_prometheus_client_is_one_line(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str
) -> None:
    relay = RelayProcess(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        env={"OUTBOXKIT_RELAY_METRICS_PORT": "0"},
        base_env=env_without("prometheus_client"),
    ).start()
    try:
        assert relay.wait_exit(60) != 0
        lines = [line for line in relay.log().splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert "outboxkit[metrics]" in lines[0]
        assert "Traceback" not in relay.log()
    finally:
        relay.stop()
