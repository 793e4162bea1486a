"""Bounded retries with exponential back-off (attempts counted per event in the inbox row)."""

from __future__ import annotations

from dataclasses import dataclass

from outboxkit.bounds import check_range, keep
from outboxkit.settings.models import DAY


@dataclass(frozen=True)
class RetryPolicy:
    """``max_attempts`` handler runs in total; the wait before run n+1 grows exponentially.

    The delays are at most a day (``DAY``) and every number is finite: a NaN or infinite delay
    would make the retry of a failed event never come due, its partition paused for good; a
    NaN ``max_attempts`` would never be exhausted.
    """

    max_attempts: int = 5
    initial_delay: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 30.0

    def __post_init__(self) -> None:
        check_range("RetryPolicy.max_attempts", self.max_attempts, 1, integer=True)
        keep(
            self,
            initial_delay=check_range(
                "RetryPolicy.initial_delay", self.initial_delay, 0, DAY, unit="seconds"
            ),
            multiplier=check_range("RetryPolicy.multiplier", self.multiplier, 1),
            max_delay=check_range("RetryPolicy.max_delay", self.max_delay, 0, DAY, unit="seconds"),
        )

    def exhausted(self, attempts: int) -> bool:
        return attempts >= self.max_attempts

    def delay(self, attempts: int) -> float:
        """Seconds to wait after the ``attempts``-th failed run."""
        exponent = max(attempts - 1, 0)
        if self.initial_delay == 0:  # no back-off at all, however many attempts
            return 0.0
        try:
            grown = self.initial_delay * float(self.multiplier) ** exponent
        except OverflowError:  # many attempts: past any max_delay long ago
            grown = self.max_delay
        return float(min(grown, self.max_delay))
