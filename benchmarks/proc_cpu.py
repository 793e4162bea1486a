"""CPU seconds of a process, or of a server with its worker processes, from /proc (Linux only).

A server counts as its process and its direct children: PostgreSQL's backends and background
workers are children of the postmaster, each in a process group and session of its own (every
child calls ``setsid()``), so a process group would miss them; Kafka's JVM is one process.
Children that already exited are counted through the parent's ``cutime``/``cstime``, so
short-lived backends are not lost between two readings, and a child alive at both readings is
counted from its own entry: each CPU second once (see :func:`tree_seconds` for a child reaped
during a reading).
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces: the fields after it start behind the last ')'.
    return text[text.rindex(")") + 2 :].split()


def process_seconds(pid: int, *, children: bool = False) -> float:
    """utime + stime (all threads); with ``children``, plus that of reaped children."""
    fields = _fields(pid)
    if fields is None:
        return 0.0
    # After the name: state(0) ppid(1) pgrp(2) ... utime(11) stime(12) cutime(13) cstime(14)
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICKS


def tree_seconds(pid: int | None) -> float:
    """``pid`` and its living direct children, each with the children it has reaped.

    A child reaped while /proc is walked would be in neither reading: the walk is repeated until
    the parent's reaped total is the same before and after it (a few tries at most)."""
    if pid is None:
        return 0.0
    for _ in range(10):
        before = _fields(pid)
        if before is None:
            return 0.0
        children = _children_ticks(pid)
        after = _fields(pid)
        if after is None:
            return 0.0
        if after[13:15] == before[13:15]:
            break
    return (sum(int(f) for f in after[11:15]) + children) / TICKS


def _children_ticks(pid: int) -> int:
    total, parent = 0, str(pid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _fields(int(entry))
        if fields is not None and fields[1] == parent:  # ppid
            total += sum(int(f) for f in fields[11:15])
    return total


def own_seconds() -> float:
    """CPU seconds of this (benchmark) process."""
    times = os.times()
    return times.user + times.system


def per_100k(before: dict[str, float], after: dict[str, float], rows: int) -> dict[str, float]:
    """CPU seconds between two readings, per 100,000 rows."""
    return {name: (after[name] - before[name]) * 100_000 / rows for name in after}


def _machine_ticks() -> list[int]:
    # /proc/stat's first line: user nice system idle iowait irq softirq steal (guest time is
    # already counted in user/nice).
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]


def machine_busy() -> float:
    """CPU seconds this machine's CPUs did work, all CPUs (other sessions' work included): next
    to the per-process figures it shows whether the machine itself is the limit. Time the
    hypervisor gave to other guests (steal) is not work done here: see :func:`machine_steal`."""
    user, nice, system, _idle, _iowait, irq, softirq, _steal = _machine_ticks()
    return (user + nice + system + irq + softirq) / TICKS


def machine_steal() -> float:
    """CPU seconds the hypervisor ran something else while this virtual machine had work: a
    drain that lost much of its time this way measured the host, not the code."""
    return _machine_ticks()[7] / TICKS
