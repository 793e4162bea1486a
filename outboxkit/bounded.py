"""A blocking call given a deadline: run in a daemon thread, waited for at most that long.

For client calls that can block for ever in C, where no timeout can be passed (librdkafka's
synchronous offset commit, and its close, when the broker went away with the commit in flight).
A call past its deadline is not stopped: it goes on in its thread, which is a daemon so that it
never holds the process at exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from outboxkit.errors import OutboxkitError

T = TypeVar("T")


class Unanswered(OutboxkitError):
    """The call did not return within its deadline (it goes on in its thread)."""


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def run(self, call: Callable[[], T]) -> None:
        try:
            self.value = call()
        except BaseException as exc:  # handed to the caller, whatever it is
            self.error = exc
        finally:
            self.done.set()

    def wait(self, seconds: float, name: str) -> T:
        if not self.done.wait(seconds):
            raise Unanswered(f"{name}: no answer within {seconds:g} s")
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # set: call() returned


def call_within(call: Callable[[], T], seconds: float, name: str) -> T:
    """``call()``'s value, or its exception, if it returns within ``seconds``; else
    :class:`Unanswered`. A thread of its own (for a call made once)."""
    outcome: _Outcome[T] = _Outcome()
    threading.Thread(target=outcome.run, args=(call,), name=name, daemon=True).start()
    return outcome.wait(seconds, name)


_Job = tuple[Callable[[], Any], _Outcome[Any]]


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while (job := jobs.get()) is not None:
        job[1].run(job[0])


class BoundedCaller:
    """:func:`call_within` on one long-lived daemon thread, for a call made again and again (an
    offset commit): starting a thread costs more than handing a call to one (about 150 us
    against a few tens). A call past its deadline keeps its thread; the next call starts
    another, and the old one ends once its call returns, if ever."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] | None = None

    def __call__(self, call: Callable[[], T], seconds: float) -> T:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(
                target=_serve, args=(self._jobs,), name=self._name, daemon=True
            ).start()
        outcome: _Outcome[T] = _Outcome()
        jobs = self._jobs
        jobs.put((call, outcome))
        try:
            return outcome.wait(seconds, self._name)
        except Unanswered:
            self._jobs = None
            jobs.put(None)  # its thread ends after the call it is held by
            raise


__all__ = ["BoundedCaller", "Unanswered", "call_within"]
