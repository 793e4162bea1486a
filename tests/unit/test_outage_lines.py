"""Lines that repeat for as long as PostgreSQL stays away, over a simulated hour: the relay's and
the consumer's start-up waits, and the status sampler's failed samples. Each is limited like the
relay's shard lines (LimitedLines: the first lines, then one a minute with the count of the
others) and its end is said. Before, they came at every attempt: about 1,000, 500 and 1,800
lines an hour."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
import pytest

from outboxkit import db
from outboxkit.inbox import startup
from outboxkit.log_limit import LimitedLines
from outboxkit.relay import runner, status_sampler
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.retry_log import SHOWN_IN_FULL
from outboxkit.relay.runner import Relay
from outboxkit.settings import load_settings
from tests.support.clock import Clock

pytestmark = pytest.mark.unit

HOUR = 3600.0
URL = "postgresql://relay@127.0.0.1:1/app"
REFUSED = "connection refused (simulated)"
# The first lines, the first line the limit sees, then at most one a minute.
MOST = SHOWN_IN_FULL + 1 + int(HOUR / 60)


def _limited(monkeypatch: pytest.MonkeyPatch, module: Any, clock: Clock) -> None:
    """``module``'s LimitedLines on ``clock`` (not raising: the code before had none)."""
    limited = functools.partial(LimitedLines, clock=clock)
    monkeypatch.setattr(module, "LimitedLines", limited, raising=False)


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


async def test_the_relay_waiting_at_start_up_for_an_hour(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    _limited(monkeypatch, runner, clock)

    def check_schema(self: Relay) -> int:
        if clock.now - 1000.0 < HOUR:
            raise psycopg.OperationalError(REFUSED)
        return 1

    async def no_checkpoints(self: Relay, shards: list[int]) -> None:
        return None

    async def wait(events: object, seconds: float) -> None:
        clock.now += seconds

    monkeypatch.setattr(Relay, "_check_schema", check_schema)
    monkeypatch.setattr(Relay, "_checkpoints", no_checkpoints)
    monkeypatch.setattr(runner, "wait_any", wait)
    relay = Relay(load_settings(overrides={"database": {"url": URL}}))
    with caplog.at_level(logging.INFO, logger=runner.logger.name):
        assert await relay._start_up() == ([0], None)
    waits = _messages(caplog, "waiting for PostgreSQL")
    assert relay.startup_waits > 700  # every 2.5-5 s (backoff_max)
    assert len(waits) <= MOST, len(waits)
    assert all(REFUSED in line for line in waits)
    # "(N similar line(s) suppressed over T s)": on the last line, or on the one before when the
    # end's flush shows the only line held back since (the back-off is random), which has no count
    assert "suppressed over" in waits[-1] or "suppressed over" in waits[-2]
    assert len(_messages(caplog, "PostgreSQL and Kafka answer after")) == 1


def test_the_consumer_waiting_at_start_up_for_an_hour(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    _limited(monkeypatch, startup, clock)
    attempts = 0

    @contextlib.contextmanager
    def connect(*args: object, **kwargs: object) -> Any:
        nonlocal attempts
        attempts += 1
        if clock.now - 1000.0 < HOUR:
            raise psycopg.OperationalError(REFUSED)
        yield None

    class Stop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            clock.now += timeout or 0.0
            return self.is_set()

    async def kafka_ok() -> None:
        return None

    monkeypatch.setattr(startup.db, "connect", connect)
    monkeypatch.setattr(startup.migrator, "require_current", lambda *_: None)
    settings = load_settings(overrides={"database": {"url": URL}})
    with caplog.at_level(logging.INFO, logger=startup.logger.name):
        assert startup._wait(settings, kafka_ok, Stop(), db.OpenConnections())
    waits = _messages(caplog, "consumer waiting for PostgreSQL")
    assert attempts > 350  # every 5-10 s
    assert len(waits) <= MOST, len(waits)
    assert len(_messages(caplog, "PostgreSQL and Kafka answer after")) == 1


class _Answering:
    """A sampling connection that answers (its statements are stubbed below)."""

    pgconn = None  # no socket: "ended while idle", so each sample reconnects


async def test_the_status_sampler_failing_for_an_hour(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    _limited(monkeypatch, status_sampler, clock)
    stop = asyncio.Event()
    opened = 0

    @contextlib.asynccontextmanager
    async def connection_async(*args: object, **kwargs: object) -> AsyncIterator[_Answering]:
        nonlocal opened
        opened += 1
        if clock.now - 1000.0 < HOUR:
            raise psycopg.OperationalError(REFUSED)
        yield _Answering()

    async def rows_async(conn: Any, query: db.Query, params: Any = None) -> Sequence[Any]:
        assert query.name == "holders"
        return []

    async def one_async(conn: Any, query: db.Query, params: Any = None) -> tuple[bool]:
        stop.set()  # the first sample after the outage
        return (False,)

    async def wait(events: object, seconds: float) -> None:
        clock.now += seconds

    monkeypatch.setattr(status_sampler.db, "connection_async", connection_async)
    monkeypatch.setattr(status_sampler.db, "rows_async", rows_async)
    monkeypatch.setattr(status_sampler.db, "one_async", one_async)
    monkeypatch.setattr(status_sampler, "wait_any", wait)
    metrics = RelayMetrics()
    with caplog.at_level(logging.INFO, logger=status_sampler.logger.name):
        await asyncio.wait_for(
            status_sampler.sample_forever(URL, "outboxkit", "g", "me", metrics, stop, every=HOUR),
            30,
        )
    failed = _messages(caplog, "status sampling failed")
    assert opened > 1700  # every 2 s
    assert len(failed) <= 1 + int(HOUR / 60), len(failed)
    assert "suppressed over" in failed[-1]
    assert len(_messages(caplog, "status sampling works again after")) == 1
