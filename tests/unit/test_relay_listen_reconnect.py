"""The LISTEN connection while PostgreSQL is away: reconnects back off (1 s doubling to 30 s,
not every second), and the loss is logged once, not at every attempt."""

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

LOST = "listen connection lost (connection refused); polling meanwhile"


class _Listening:
    """A LISTEN that succeeds; its notifications end at once, or fail as a dropped connection."""

    def __init__(self, drop: bool) -> None:
        self.drop = drop

    def notifies(self) -> AsyncIterator[Any]:
        async def none() -> AsyncIterator[Any]:
            if self.drop:
                raise OSError("connection refused")
            return
            yield  # an async generator

        return none()


async def _listen(
    monkeypatch: pytest.MonkeyPatch, refused: int, dropped: int
) -> tuple[list[int], list[int | None]]:
    """``refused`` connections fail, the next ``dropped`` drop right after their LISTEN, then
    one stays (its first hint stops the loop): the back-off's attempts, and the hints."""
    calls: list[int] = []
    delays: list[int] = []
    stop = asyncio.Event()

    @contextlib.asynccontextmanager
    async def connection_async(url: Any, **options: Any) -> AsyncIterator[_Listening]:
        calls.append(1)
        if len(calls) <= refused:
            raise OSError("connection refused")
        yield _Listening(drop=len(calls) <= refused + dropped)

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
        if len(calls) > refused + dropped:
            stop.set()

    url = SecretStr("postgresql://x")
    await asyncio.wait_for(notify.listen_forever(url, "outboxkit", on_notify, stop), 10)
    return delays, hints


async def test_reconnects_back_off_and_the_loss_is_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=notify.logger.name):
        delays, hints = await _listen(monkeypatch, refused=6, dropped=0)
    assert delays == [1, 2, 3, 4, 5, 6]  # each failure waits longer (the back-off's attempt)
    assert hints == [None]  # listening again: anything committed meanwhile
    lines = [r.getMessage() for r in caplog.records if r.name == notify.logger.name]
    assert lines == [LOST]  # the five after it are counted, shown with a later line


async def test_a_connection_dropped_right_after_its_listen_keeps_backing_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A proxy or an idle timeout closing the connection at once: not a new outage each time."""
    with caplog.at_level(logging.INFO, logger=notify.logger.name):
        delays, hints = await _listen(monkeypatch, refused=2, dropped=4)
    assert delays == [1, 2, 3, 4, 5, 6]
    assert hints == [None] * 5
    assert [r.getMessage() for r in caplog.records if r.name == notify.logger.name] == [LOST]
