"""Waiting without sleeping blind: jittered back-off, and a sleep that an event cuts short."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence


def backoff_delay(attempt: int, initial: float, maximum: float, rng: random.Random) -> float:
    """Bounded exponential back-off with full jitter in [base/2, base]."""
    base = min(maximum, initial * (2 ** max(0, attempt - 1)))
    return rng.uniform(base / 2, base)


async def wait_any(events: Sequence[asyncio.Event], seconds: float) -> None:
    """Sleep up to ``seconds``, less if any of the events is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
