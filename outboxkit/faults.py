"""Fault points for the acceptance tests: SIGKILL (or SIGSTOP) this process at an instruction.

One grammar for every process, enabled only by ``OUTBOXKIT_FAULT=<point>[:<n>][:stop]``: act the
n-th time the point is reached (default 1); ``stop`` freezes the process with SIGSTOP instead of
killing it (a zombie to resume with SIGCONT). Consumer points: ``before_db_commit`` and
``after_db_commit`` (the handler's transaction committed, the Kafka offset not). Relay points:
``after_claim``, ``before_send`` (the Kafka transaction begun, nothing sent
yet), ``between_claims`` (a transaction of several claims open, one claim's records sent, the
next claim in hand), ``after_produce``, ``after_kafka_commit``, ``after_mark``; and, around
the producers a shard uses in turn, ``before_commit_slot<n>`` (slot n's records sent, not
committed, the other slot's last transaction committed) and ``after_commit_slot<n>`` (slot n
committed, not marked).
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass

FAULT_ENV = "OUTBOXKIT_FAULT"
POINTS = (
    "before_db_commit",
    "after_db_commit",
    "after_claim",
    "before_send",
    "after_produce",
    "between_claims",
    "after_kafka_commit",
    "after_mark",
    *(f"{when}_commit_slot{n}" for n in range(4) for when in ("before", "after")),
)


@dataclass(frozen=True)
class FaultSpec:
    point: str
    nth: int = 1
    stop: bool = False


def parse_fault(spec: str | None) -> FaultSpec | None:
    if not spec:
        return None
    point, *rest = spec.split(":")
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {', '.join(POINTS)}")
    nth, stop = 1, False
    for part in rest:
        if part == "stop":
            stop = True
        elif part:
            nth = int(part)
    return FaultSpec(point, nth, stop)


class FaultPoints:
    def __init__(self, spec: str | None = None) -> None:
        self._armed = parse_fault(spec if spec is not None else os.environ.get(FAULT_ENV))
        self._hits = 0

    def reach(self, point: str) -> None:
        armed = self._armed
        if armed is None or armed.point != point:
            return
        self._hits += 1
        if self._hits != armed.nth:
            return
        how = signal.SIGSTOP if armed.stop else signal.SIGKILL
        sys.stderr.write(f"outboxkit fault point {point}: {how.name}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), how)


_process_points: FaultPoints | None = None


def fault_point(point: str) -> None:
    """Reach ``point`` on this process's fault points (read from the environment once)."""
    global _process_points
    if _process_points is None:
        _process_points = FaultPoints()
    _process_points.reach(point)
