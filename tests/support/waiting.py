"""Waiting on a condition, never a fixed sleep: poll it until true or a deadline, then say what."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any], *, timeout: float = 90.0, what: str = "condition"
) -> Any:
    """The predicate's first truthy value; an AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last {value!r}")
        time.sleep(0.1)


async def wait_for_async(
    predicate: Callable[[], Any], *, within: float = 90.0, what: str = "condition"
) -> Any:
    """:func:`wait_for` from a coroutine; the (blocking) predicate runs in a thread."""
    timeout = within
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last {value!r}")
        await asyncio.sleep(0.1)
