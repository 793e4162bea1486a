"""CPU seconds of each system's processes and of the machine, so a run shows where time went
(a process with its direct children: ``benchmarks.proc_cpu.tree_seconds``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from benchmarks.proc_cpu import machine_busy, machine_steal, own_seconds, tree_seconds


def sample(pids: Mapping[str, int | None]) -> dict[str, float]:
    """CPU seconds so far of each named process tree, this benchmark process and the machine."""
    out = {name: tree_seconds(pid) for name, pid in pids.items()}
    out["bench_process"] = own_seconds()
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
