"""Metrics endpoint, /healthz, and retention of published rows by the shard holder."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from outboxkit.relay.lease_loss import LeaseLoss
from tests.relay_support import (
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
    set_shard_count,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode()
        exc.close()
        return int(exc.code), body


async def test_metrics_and_health(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 2)
    rows = [item for key in "abcdef" for item in payloads(key, 3)]
    insert_rows(outboxkit_db_url, topic, rows)
    port = _free_port()
    # This relay watches shard 0 only: shard 1 has backlog and no holder -> unhealthy.
    settings = relay_settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, metrics_port=port, shards=(0,)
    )
    base = f"http://127.0.0.1:{port}"
    async with running_relay(settings):

        def shard_1_unhealthy() -> bool:
            code, body = _get(f"{base}/healthz")
            problems = json.loads(body)["shards_with_backlog_and_no_holder"]
            return code == 503 and problems == ["1"]

        await wait_for_async(shard_1_unhealthy, what="unhealthy for shard 1 only")

        def shard_0_active() -> bool:
            # The lease row (read by /healthz) is taken before the worker reports itself active.
            return 'outboxkit_relay_lease_active{shard="0"} 1.0' in _get(f"{base}/metrics")[1]

        await wait_for_async(shard_0_active, what="shard 0 reported active")
        _, metrics = await asyncio.to_thread(_get, f"{base}/metrics")
        assert 'outboxkit_relay_published_total{shard="0"}' in metrics
        assert 'outboxkit_relay_backlog{shard="1"}' in metrics
        assert "outboxkit_relay_oldest_pending_seconds" in metrics
        assert "outboxkit_relay_lease_token" in metrics
        for cause in LeaseLoss:  # every reason's series exists from the start, at 0
            assert f'outboxkit_relay_lease_lost_total{{reason="{cause}",shard="0"}} 0.0' in metrics
    # A second relay for shard 1 as well: everything drains, health recovers.
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, metrics_port=port)
    async with running_relay(settings):
        await wait_for_async(lambda: row_states(outboxkit_db_url) == {"published": len(rows)})
        await wait_for_async(lambda: _get(f"{base}/healthz")[0] == 200, what="healthy")
        _, metrics = await asyncio.to_thread(_get, f"{base}/metrics")
        published = sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("outboxkit_relay_published_total")
        )
        assert published > 0


async def test_retention_removes_published_rows_in_small_batches(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    insert_rows(outboxkit_db_url, topic, payloads("k", 30))
    kept = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, retention_seconds=3600)
    async with running_relay(kept) as relay:
        await wait_for_async(lambda: row_states(outboxkit_db_url) == {"published": 30})
        worker = relay.workers[0]
        passes = worker.housekeeping.retention_passes
        await wait_for_async(
            lambda: worker.housekeeping.retention_passes > passes, what="a retention pass"
        )
        assert row_states(outboxkit_db_url) == {"published": 30}  # nothing is an hour old
    purge = relay_settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, retention_seconds=0, retention_batch=7
    )
    async with running_relay(purge):
        insert_rows(outboxkit_db_url, topic, payloads("k", 5, start=30))
        await wait_for_async(lambda: row_states(outboxkit_db_url) == {}, what="rows removed")
