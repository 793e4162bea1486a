"""State files of running ``outboxkit dev up`` stacks: one per process, found by ``dev env``.

Each stack writes ``dev-up-<pid>.json`` (mode 0600: it holds passwords) with the environment that
points at it, so several stacks can run side by side and ``dev env`` never prints another
stack's URLs. A file whose process is gone (or whose pid now belongs to another process) is
stale and removed when listed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from outboxkit.devstack.files import cache_dir, write_private
from outboxkit.devstack.registry import alive, start_ticks
from outboxkit.errors import DevStackError

_PREFIX = "dev-up-"


@dataclass(frozen=True)
class DevUpState:
    """What one running ``dev up`` published: its pid, environment and a human summary."""

    pid: int
    ticks: int | None
    env: dict[str, str]
    summary: list[str]


def state_dir() -> Path:
    return cache_dir()


def state_path(pid: int, directory: Path | None = None) -> Path:
    return (directory or state_dir()) / f"{_PREFIX}{pid}.json"


def write_state(env: dict[str, str], summary: list[str], directory: Path | None = None) -> Path:
    """Publish this process's stack; returns the file (the caller removes it on exit)."""
    pid = os.getpid()
    path = state_path(pid, directory)
    body = {"pid": pid, "ticks": start_ticks(pid), "env": env, "summary": summary}
    write_private(path, json.dumps(body))
    return path


def _parse(path: Path) -> DevUpState | None:
    try:
        body = json.loads(path.read_text())
        ticks = body.get("ticks")
        state = DevUpState(
            pid=int(body["pid"]),
            ticks=ticks if isinstance(ticks, int) else None,
            env={str(k): str(v) for k, v in dict(body["env"]).items()},
            summary=[str(line) for line in body.get("summary", [])],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if path.name != f"{_PREFIX}{state.pid}.json":
        return None
    return state


def live_states(directory: Path | None = None) -> list[DevUpState]:
    """The stacks whose ``dev up`` process still runs, by pid; stale files are removed."""
    states = []
    for path in sorted((directory or state_dir()).glob(f"{_PREFIX}*.json")):
        state = _parse(path)
        if state is not None and alive(state.pid, state.ticks):
            states.append(state)
        else:  # written atomically, so unreadable means damaged, not half-written
            path.unlink(missing_ok=True)
    return sorted(states, key=lambda s: s.pid)


def pick_state(states: list[DevUpState], pid: int | None) -> DevUpState:
    """The one stack meant: the only live one, or the one ``pid`` names; else say what runs."""
    if pid is not None:
        for state in states:
            if state.pid == pid:
                return state
        raise DevStackError(f"no running `outboxkit dev up` with pid {pid}{_listing(states)}")
    if len(states) == 1:
        return states[0]
    if not states:
        raise DevStackError("no running `outboxkit dev up` found")
    raise DevStackError(
        f"{len(states)} `outboxkit dev up` stacks are running; choose one with --pid"
        f"{_listing(states)}"
    )


def _listing(states: list[DevUpState]) -> str:
    if not states:
        return ""
    lines = []
    for state in states:
        lines.append(f"  pid {state.pid}:")
        lines.extend(f"    {line}" for line in state.summary)
    return "\nrunning:\n" + "\n".join(lines)
