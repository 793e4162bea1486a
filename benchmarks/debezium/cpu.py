"""CPU seconds of a process and its direct children, from /proc, so a run shows where time went.

PostgreSQL's backends are children of the postmaster; a backend that exits is reaped by it and
its CPU time moves into the postmaster's ``cutime``/``cstime``, so the difference of two samples
counts it exactly once either way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from benchmarks.proc_cpu import machine_busy, machine_steal

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which may itself contain spaces and parentheses.
    return text.rsplit(")", 1)[1].split()


def _own_and_reaped(fields: list[str]) -> float:
    # state is field 3 of stat(5), i.e. index 0 here; utime, stime, cutime, cstime are 14-17.
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICK


def tree_cpu(pid: int | None) -> float:
    """CPU seconds of ``pid`` plus its living direct children (plus the reaped ones)."""
    if pid is None:
        return 0.0
    fields = _stat(pid)
    if fields is None:
        return 0.0
    total = _own_and_reaped(fields)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        child = _stat(int(entry.name))
        if child is not None and child[1] == str(pid):
            total += _own_and_reaped(child)
    return total


def sample(pids: Mapping[str, int | None]) -> dict[str, float]:
    """CPU seconds so far of each named process tree, this benchmark process and the machine."""
    out = {name: tree_cpu(pid) for name, pid in pids.items()}
    times = os.times()
    out["bench_process"] = times.user + times.system
    # machine_busy keeps the meaning of the results already saved (steal counted as busy);
    # machine_steal says how much of it the hypervisor gave to other guests.
    steal = machine_steal()
    out["machine_busy"] = machine_busy() + steal
    out["machine_steal"] = steal
    return out


def delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before.get(name, 0.0), 2) for name in after}


def loadavg() -> list[float]:
    return [float(part) for part in Path("/proc/loadavg").read_text().split()[:3]]
