"""Stand-ins for prometheus_client when the ``metrics`` extra is not installed.

The relay counts everything through the same calls either way; without the extra the counts go
nowhere, and asking for a metrics endpoint is a one-line error naming the extra.
"""

from __future__ import annotations

from typing import Any


class NullMetric:
    """Accepts every call a Counter, Gauge or Histogram does (``labels``, ``inc``, ...)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def labels(self, *args: Any, **kwargs: Any) -> NullMetric:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, value: float) -> None:
        pass

    def collect(self) -> list[Any]:
        return []

    def remove(self, *labelvalues: Any) -> None:
        pass


class NullRegistry:
    pass
