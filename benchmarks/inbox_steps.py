"""Where a middleware event's time goes: each step the inbox core hands its driver, timed.

``consumer.py --steps`` wraps the drivers' executor (``StepsBase`` of
``outboxkit.inbox.executor_base``) for one variant's run and prints the seconds spent in each
kind of step (``Sql`` and ``HandlerSql`` by statement name) per event. A step that returns an
awaitable (the async driver) is timed until it is awaited to the end, so with aiokafka a step's
time also holds whatever else the event loop ran meanwhile (the client's fetcher, the lease
task): there the figures overlap. What is left of the run's time is the core's own Python, the
loop and the start-up. Benchmark code, not part of outboxkit.
"""

from __future__ import annotations

import inspect
import time
from collections import defaultdict
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import Any

from outboxkit.inbox import executor_base
from outboxkit.inbox.steps import HandlerSql, Sql


def _name(step: Any) -> str:
    kind = type(step).__name__
    return f"{kind}:{step.query.name}" if isinstance(step, Sql | HandlerSql) else kind


@contextmanager
def timed_steps() -> Iterator[dict[str, float]]:
    """Seconds per step kind while the block runs (the executor is restored afterwards)."""
    spent: dict[str, float] = defaultdict(float)
    original = executor_base.StepsBase.__call__

    async def _until_done(awaitable: Awaitable[Any], name: str, started: float) -> Any:
        try:
            return await awaitable
        finally:
            spent[name] += time.perf_counter() - started

    def timed(self: executor_base.StepsBase, step: Any) -> Any:
        name, started = _name(step), time.perf_counter()
        try:
            result = original(self, step)
        except BaseException:
            spent[name] += time.perf_counter() - started
            raise
        if inspect.isawaitable(result):
            return _until_done(result, name, started)
        spent[name] += time.perf_counter() - started
        return result

    executor_base.StepsBase.__call__ = timed  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        executor_base.StepsBase.__call__ = original  # type: ignore[method-assign]


def print_steps(label: str, spent: dict[str, float], events: int, seconds: float) -> None:
    """Microseconds per event of each step kind, largest first, and what is left over."""
    total = sum(spent.values())
    print(f"    {label}: {seconds / events * 1e6:.0f} us an event in all (start-up included)")
    for name, value in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"      {name:36} {value / events * 1e6:7.1f} us")
    left = (seconds - total) / events * 1e6
    print(f"      {'outside the steps':36} {left:7.1f} us (core Python, loop, start-up)")
