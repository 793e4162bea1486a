"""Whether this machine was paused while a figure was measured (a VM snapshot or migration).

A paused virtual machine's monotonic clock stands still and its wall clock is set forward on
resume, so a figure measured across the pause is off by the pause (latencies, rates) and, with
PostgreSQL on the same machine, leases expire by the database clock. Benchmarks print a warning
under such a figure instead of quoting it silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# NTP slews a clock by at most 0.5 ms a second: a minute of measuring moves it ~30 ms.
THRESHOLD = 0.5


class PauseWatch:
    """The wall clock's jump against the monotonic clock since the last :meth:`take`."""

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall, self._monotonic = wall, monotonic
        self._offset = self._now_offset()
        self.total = 0.0

    def _now_offset(self) -> float:
        return self._wall() - self._monotonic()

    def take(self) -> float:
        offset = self._now_offset()
        jumped, self._offset = offset - self._offset, offset
        if abs(jumped) >= THRESHOLD:
            self.total += abs(jumped)
        return jumped

    def warn(self) -> None:
        """Print a warning under the figure just printed if the machine was paused meanwhile."""
        jumped = self.take()
        if abs(jumped) >= THRESHOLD:
            print(
                f"  !! the wall clock jumped {jumped:+.1f}s against the monotonic clock during the"
                " figure above: the machine was paused (a VM snapshot or migration) or its clock"
                " was stepped; that figure is not comparable",
                flush=True,
            )
