"""A blocking call given a deadline: run in a daemon thread, waited for at most that long.

For client calls that can block for ever in C, where no timeout can be passed (librdkafka's
synchronous offset commit, and its close, when the broker went away with the commit in flight).
A call past its deadline is not stopped: it goes on in its thread, which is a daemon so that it
never holds the process at exit.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from outboxkit.errors import OutboxkitError

T = TypeVar("T")


class Unanswered(OutboxkitError):
    """The call did not return within its deadline (it goes on in its thread)."""


class _Outcome(Generic[T]):
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None


def call_within(call: Callable[[], T], seconds: float, name: str) -> T:
    """``call()``'s value, or its exception, if it returns within ``seconds``; else
    :class:`Unanswered`."""
    outcome: _Outcome[T] = _Outcome()

    def run() -> None:
        try:
            outcome.value = call()
        except BaseException as exc:  # handed to the caller, whatever it is
            outcome.error = exc
        finally:
            outcome.done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    if not outcome.done.wait(seconds):
        raise Unanswered(f"{name}: no answer within {seconds:g} s")
    if outcome.error is not None:
        raise outcome.error
    return outcome.value  # type: ignore[return-value]  # set: call() returned


__all__ = ["Unanswered", "call_within"]
