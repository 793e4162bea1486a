"""Bounded retries with exponential back-off (attempts counted per event in the inbox row)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """``max_attempts`` handler runs in total; the wait before run n+1 grows exponentially."""

    max_attempts: int = 5
    initial_delay: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 30.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.initial_delay < 0 or self.max_delay < 0 or self.multiplier < 1:
            raise ValueError("delays must be >= 0 and multiplier >= 1")

    def exhausted(self, attempts: int) -> bool:
        return attempts >= self.max_attempts

    def delay(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed run."""
        exponent = max(attempts - 1, 0)
        return float(min(self.initial_delay * self.multiplier**exponent, self.max_delay))
