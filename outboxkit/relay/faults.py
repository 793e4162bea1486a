"""Fault points for the acceptance tests: SIGKILL this process at a named instruction.

Enabled only by ``OUTBOXKIT_FAULT=<point>[:<n>]`` (kill at the n-th time the point is reached,
default 1). Points: ``after_claim``, ``after_produce``, ``after_kafka_commit``, ``after_mark``.
"""

from __future__ import annotations

import os
import signal
import sys

FAULT_ENV = "OUTBOXKIT_FAULT"
POINTS = ("after_claim", "after_produce", "after_kafka_commit", "after_mark")


def _parse(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    point, _, count = spec.partition(":")
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {', '.join(POINTS)}")
    return point, int(count or 1)


class FaultPoints:
    def __init__(self, spec: str | None = None) -> None:
        self._armed = _parse(spec if spec is not None else os.environ.get(FAULT_ENV))
        self._hits = 0

    def reach(self, point: str) -> None:
        if self._armed is None or self._armed[0] != point:
            return
        self._hits += 1
        if self._hits >= self._armed[1]:
            sys.stderr.write(f"outboxkit fault point {point}: SIGKILL\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
