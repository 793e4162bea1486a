"""The LISTEN connection while PostgreSQL is away: reconnects back off (1 s doubling to 30 s,
not every second), the loss is logged once, not at every attempt, and its end is logged."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import SecretStr

from outboxkit.relay import notify

pytestmark = pytest.mark.unit


class _Listening:
    def notifies(self) -> AsyncIterator[Any]:
        async def none() -> AsyncIterator[Any]:
            return
            yield  # an async generator that ends at once

        return none()


async def test_reconnects_back_off_and_the_outage_is_logged_once_then_its_end(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[int] = []
    delays: list[int] = []
    stop = asyncio.Event()

    @contextlib.asynccontextmanager
    async def connection_async(url: Any, **options: Any) -> AsyncIterator[_Listening]:
        attempts.append(1)
        if len(attempts) <= 6:
            raise OSError("connection refused")
        yield _Listening()

    async def execute_async(*args: Any) -> int:
        return 0

    def backoff(failures: int, initial: float, maximum: float, rng: Any) -> float:
        assert (initial, maximum) == (1.0, 30.0)
        delays.append(failures)
        return 0.001

    monkeypatch.setattr(notify.db, "connection_async", connection_async)
    monkeypatch.setattr(notify.db, "execute_async", execute_async)
    monkeypatch.setattr(notify, "backoff_delay", backoff)
    hints: list[int | None] = []

    def on_notify(shard: int | None) -> None:
        hints.append(shard)
        stop.set()

    with caplog.at_level(logging.INFO, logger=notify.logger.name):
        await asyncio.wait_for(
            notify.listen_forever(SecretStr("postgresql://x"), "outboxkit", on_notify, stop), 10
        )
    assert delays == [1, 2, 3, 4, 5, 6]  # each failure waits longer (the back-off's attempt)
    assert hints == [None]  # listening again: anything committed meanwhile
    lines = [r.getMessage() for r in caplog.records if r.name == notify.logger.name]
    assert lines[0] == "listen connection lost (connection refused); polling meanwhile"
    assert lines[1].startswith("listen connection lost (connection refused); polling meanwhile (")
    assert lines[1].endswith("similar lines suppressed over 1 s)")  # the count, at the end
    assert lines[2].startswith("listen connection back after ")
    assert len(lines) == 3, lines
