"""Waiting without sleeping blind: jittered back-off, and a sleep that an event cuts short."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any


def backoff_delay(attempt: int, initial: float, maximum: float, rng: random.Random) -> float:
    """Bounded exponential back-off with full jitter in [base/2, base]. The exponent is capped:
    after a thousand failures in a row (hours of an outage) ``2 ** attempt`` would no longer
    fit a float, and the loop that waits would die of an OverflowError."""
    base = min(maximum, initial * (2 ** min(max(0, attempt - 1), 60)))
    return rng.uniform(base / 2, base)


async def wait_any(events: Sequence[asyncio.Event], seconds: float) -> None:
    """Sleep up to ``seconds``, less if any of the events is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def finished_unless(task: asyncio.Future[Any], stop: asyncio.Event) -> bool:
    """Await ``task`` (raising its error) unless ``stop`` is set first: then it is cancelled,
    its clean-up awaited, and False returned. A Kafka call that cannot succeed (a refused login)
    waits out its whole timeout; a stopping relay must not wait with it."""
    waiter = asyncio.ensure_future(stop.wait())
    try:
        if not stop.is_set():  # else not begun: cancelled before its first step, it never runs
            await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait([task])  # its clean-up; an outer cancellation still propagates
    if task.cancelled():
        return False
    task.result()
    return True
