"""While a relay cannot read PostgreSQL, its sampled gauges keep their last values: /healthz
fails once they are older than the grace, and the pause flag is sampled like the holders."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from outboxkit import db
from outboxkit.relay import status_sampler
from outboxkit.relay.metrics import RelayMetrics
from tests.relay_support import cli_ok, insert_rows, payloads, relay_settings, running_relay
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration


def _value(metric: Any) -> float:
    value: float = metric._value.get()
    return value


def _unhealthy(metrics: RelayMetrics) -> dict[str, Any] | None:
    """/healthz's detail once it fails, else None (a condition to wait on)."""
    ok, detail = metrics.healthy()
    return None if ok else detail


@contextlib.asynccontextmanager
async def _sampling(
    url: str, metrics: RelayMetrics, stale_after: float | None = None
) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(
        status_sampler.sample_forever(
            url, "outboxkit", "default", "me", metrics, stop, every=0.05, stale_after=stale_after
        )
    )
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_health_goes_stale_when_the_sampler_cannot_reconnect(
    outboxkit_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = db.connection_async
    opened = 0

    def connection_async(*args: Any, **kwargs: Any) -> Any:
        nonlocal opened
        opened += 1
        if opened > 1:
            raise psycopg.OperationalError("connection refused (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(db, "connection_async", connection_async)
    metrics = RelayMetrics()
    async with _sampling(outboxkit_db_url, metrics, stale_after=0.5):
        await wait_for_async(lambda: _value(metrics.status_sampled) > 0, what="a first sample")
        assert metrics.healthy()[0]
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'outboxkit-relay-sample'"
                " AND datname = current_database()"
            )
        detail = await wait_for_async(
            lambda: _unhealthy(metrics),
            within=60,
            what="/healthz failing on the stale sample",
        )
        assert detail["status_stale"] is True
        assert detail["status_age_seconds"] >= 0.5
        await wait_for_async(lambda: opened > 1, what="a reconnect attempt")
        assert metrics.healthy()[1]["status_stale"] is True  # a failed attempt is no sample


async def test_the_pause_flag_is_sampled(outboxkit_db_url: str) -> None:
    metrics = RelayMetrics()
    async with _sampling(outboxkit_db_url, metrics):
        await wait_for_async(lambda: _value(metrics.status_sampled) > 0, what="a first sample")
        assert _value(metrics.paused) == 0
        cli_ok(outboxkit_db_url, "relay", "pause", "--reason", "test")
        await wait_for_async(lambda: _value(metrics.paused) == 1, what="the pause sampled")
        assert metrics.healthy()[1]["paused"] is True
        cli_ok(outboxkit_db_url, "relay", "resume")
        await wait_for_async(lambda: _value(metrics.paused) == 0, what="the resume sampled")
        assert "paused" not in metrics.healthy()[1]


class _Proxy:
    """A TCP proxy to PostgreSQL that can be cut: the partition of the audit, reproduced."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers += [writer, up_writer]
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def cut(self) -> None:
        """Refuse new connections, break the open ones (idempotent)."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()


async def test_a_relay_cut_off_from_postgresql_fails_healthz_and_drops_its_token(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: Any
) -> None:
    parts = urlsplit(outboxkit_db_url)
    assert parts.hostname is not None
    assert parts.port is not None
    proxy = _Proxy(parts.hostname, parts.port)
    await proxy.start()
    netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{proxy.port}"
    proxied = urlunsplit(parts._replace(netloc=netloc))
    topic = outboxkit_topic()
    settings = relay_settings(proxied, outboxkit_kafka_bootstrap, mode="at_least_once")
    metrics = RelayMetrics()
    try:
        await _cut_off(proxy, outboxkit_db_url, topic, settings, metrics)
    finally:
        proxy.cut()


async def _cut_off(
    proxy: _Proxy, db_url: str, topic: str, settings: Any, metrics: RelayMetrics
) -> None:
    async with running_relay(settings, metrics=metrics) as relay:
        worker = relay.workers[0]
        await asyncio.wait_for(worker.active.wait(), 60)
        await wait_for_async(
            lambda: _value(metrics.group_active.labels("0")) == 1, what="the holder sampled"
        )
        assert metrics.healthy()[0]
        assert _value(metrics.lease_token.labels("0")) > 0
        proxy.cut()
        insert_rows(db_url, topic, payloads("k", 5))  # a backlog no gauge shows
        await wait_for_async(lambda: not worker.active.is_set(), what="the term ended")
        assert _value(metrics.lease_token.labels("0")) == 0
        detail = await wait_for_async(
            lambda: _unhealthy(metrics),
            within=60,
            what="/healthz failing on the stale sample",
        )
        assert detail["status_stale"] is True
        assert _value(metrics.group_active.labels("0")) == 1  # the last value, kept
