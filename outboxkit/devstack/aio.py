"""Run a coroutine to completion from sync dev tooling, inside or outside a running event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_coroutine(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` in a thread of its own (an async test may be calling a sync fixture)."""
    with ThreadPoolExecutor(1, thread_name_prefix="outboxkit-devstack") as pool:
        return pool.submit(asyncio.run, coro).result()
