"""A clock a test moves by hand, for code that takes an injectable ``clock``."""

from __future__ import annotations


class Clock:
    """``clock()`` is ``now``; move it with ``clock.now += seconds``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
