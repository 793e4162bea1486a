"""`outboxkit_relay_lease_token` is the token of a term this process holds: 0 once it ended,
like `outboxkit_relay_lease_active`, never the old term's token."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from outboxkit.relay.metrics import RelayMetrics
from tests.relay_support import relay_settings, running_relay

pytestmark = pytest.mark.integration


def _value(metric: Any) -> float:
    value: float = metric._value.get()
    return value


async def test_the_token_gauge_goes_back_to_0_when_the_term_ends(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str
) -> None:
    metrics = RelayMetrics()
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, mode="at_least_once")
    async with running_relay(settings, metrics=metrics) as relay:
        worker = relay.workers[0]
        await asyncio.wait_for(worker.active.wait(), 60)
        assert worker.term is not None
        assert _value(metrics.lease_token.labels("0")) == worker.term.token
    assert _value(metrics.lease_active.labels("0")) == 0
    assert _value(metrics.lease_token.labels("0")) == 0
