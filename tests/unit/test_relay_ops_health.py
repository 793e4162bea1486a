"""/healthz judges the sampled gauges' age: while the relay cannot read the group's status from
PostgreSQL, the gauges keep their last ("healthy") values, so only their age can say so."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from outboxkit import db
from outboxkit.relay import status_sampler
from outboxkit.relay.metrics import COUNT_GRACE, RelayMetrics

pytestmark = pytest.mark.unit

pytest.importorskip("prometheus_client")


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _value(metric: Any) -> float:
    value: float = metric._value.get()
    return value


def test_health_fails_once_no_sample_succeeded_within_the_grace() -> None:
    clock = _Clock()
    metrics = RelayMetrics(clock=clock)
    clock.now += 3600
    assert metrics.healthy()[0]  # no sampler expected (tests, a relay still starting): no age
    metrics.expect_samples(15.0)
    clock.now += 15
    assert metrics.healthy() == (True, {"shards_with_backlog_and_no_holder": []})
    metrics.sampled(False)
    assert _value(metrics.status_sampled) > 0
    clock.now += 16
    ok, detail = metrics.healthy()
    assert not ok
    assert detail == {
        "shards_with_backlog_and_no_holder": [],
        "status_stale": True,
        "status_age_seconds": 16.0,
    }
    metrics.sampled(False)
    assert metrics.healthy()[0]


def test_a_long_full_count_in_progress_is_not_staleness_up_to_its_own_grace() -> None:
    """Under a huge backlog one full count can outlast the grace: the relay is healthy meanwhile
    (readiness must not fail during a drain), but a count that hangs is not."""
    clock = _Clock()
    metrics = RelayMetrics(clock=clock)
    metrics.expect_samples(15.0)
    metrics.sampled(False)
    metrics.counting(True)
    clock.now += 60
    assert metrics.healthy()[0]
    clock.now += COUNT_GRACE
    assert not metrics.healthy()[0]
    metrics.counting(False)
    metrics.sampled(False)
    assert metrics.healthy()[0]
    metrics.counting(True)
    metrics.counting(False)  # a count that ended (failed) leaves the age as it was
    clock.now += 16
    assert not metrics.healthy()[0]


def test_the_grace_counts_from_the_samplers_start_before_any_success() -> None:
    clock = _Clock()
    metrics = RelayMetrics(clock=clock)
    metrics.expect_samples(15.0)
    clock.now += 20
    assert metrics.healthy()[1].get("status_stale") is True
    assert _value(metrics.status_sampled) == 0  # never read: the alert sees an old timestamp


def test_the_pause_is_a_gauge_and_in_healthz() -> None:
    metrics = RelayMetrics()
    metrics.sampled(True)
    assert _value(metrics.paused) == 1
    assert metrics.healthy() == (
        True,
        {"shards_with_backlog_and_no_holder": [], "paused": True},
    )
    metrics.sampled(False)
    assert _value(metrics.paused) == 0
    assert "paused" not in metrics.healthy()[1]


def test_healthz_answers_503_naming_the_stale_status() -> None:
    clock = _Clock()
    metrics = RelayMetrics(clock=clock)
    metrics.expect_samples(5.0)
    server = metrics.serve(0)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert answer.status == 200
        clock.now += 6
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(url, timeout=10)
        assert caught.value.code == 503
        body = json.loads(caught.value.read())
        assert body["ok"] is False
        assert body["status_stale"] is True
    finally:
        server.shutdown()
        server.server_close()


class _Conn:
    pass


async def test_the_sampler_records_successes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """One good sample, then every statement and reconnect fails: the record stays at the good
    sample's time, so the age grows past the grace (a fake clock stands in for the wait)."""
    clock = _Clock()
    metrics = RelayMetrics(clock=clock)
    failed = asyncio.Event()
    sampled_once = asyncio.Event()
    connections = 0

    class _Session:
        async def __aenter__(self) -> _Conn:
            nonlocal connections
            connections += 1
            if connections > 1:
                failed.set()
                raise psycopg.OperationalError("connection refused (injected)")
            return _Conn()

        async def __aexit__(self, *exc: object) -> None:
            return None

    calls = 0

    async def rows_async(conn: Any, query: Any, params: Any = None) -> Sequence[Any]:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise psycopg.OperationalError("server closed the connection (injected)")
        return [(0, True, 0, False)]  # shard 0 held by another process, nothing parked

    async def one_async(conn: Any, query: Any, params: Any = None) -> Any:
        sampled_once.set()
        return (False,)

    monkeypatch.setattr(db, "connection_async", lambda *a, **k: _Session())
    monkeypatch.setattr(db, "rows_async", rows_async)
    monkeypatch.setattr(db, "one_async", one_async)
    monkeypatch.setattr(status_sampler, "wait_any", _no_wait)
    stop = asyncio.Event()
    task = asyncio.create_task(
        status_sampler.sample_forever(
            "postgresql://nowhere/db", "outboxkit", "default", "me", metrics, stop,
            every=1.0, stale_after=15.0,
        )
    )  # fmt: skip
    try:
        await asyncio.wait_for(sampled_once.wait(), 30)
        await asyncio.wait_for(failed.wait(), 30)
        assert _value(metrics.group_active.labels("0")) == 1  # the last value stays
        clock.now += 14
        assert metrics.healthy()[0]
        clock.now += 2
        assert metrics.healthy()[1].get("status_stale") is True
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def _no_wait(events: Any, seconds: float) -> None:
    await asyncio.sleep(0)
