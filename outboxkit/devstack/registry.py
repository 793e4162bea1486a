"""A registry of started services, so the next run can clean up after a SIGKILLed owner.

Each running service has one JSON entry in the cache directory: its pid, its owner's pid, both
processes' start times (so a recycled pid is never mistaken for them) and the directory it owns.
The reaper kills a service only if it is still the process that was registered, and deletes a
directory only if :func:`outboxkit.devstack.files.is_own_dir` proves the dev stack made it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from outboxkit.devstack.files import cache_dir, is_own_dir, make_owned_dir, write_private

logger = logging.getLogger("outboxkit.devstack")


def registry_dir() -> Path:
    path = cache_dir() / "running"
    path.mkdir(parents=True, exist_ok=True)
    return path


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc``), ``None`` if unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])  # field 22 of stat; fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


def alive(pid: int, ticks: int | None = None) -> bool:
    """True while ``pid`` exists, is not a zombie and (if ``ticks`` is given) started then."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: existence is all we can tell
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return ticks is None or start_ticks(pid) in (None, ticks)


def register(pid: int, name: str, owned_dir: Path | None, dir_token: str | None) -> None:
    entry = {
        "owner": os.getpid(),
        "owner_ticks": start_ticks(os.getpid()),
        "pid": pid,
        "ticks": start_ticks(pid),
        "name": name,
        "dir": str(owned_dir) if owned_dir else None,
        "token": dir_token,
    }
    write_private(registry_dir() / f"{pid}.json", json.dumps(entry))


def unregister(pid: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        (registry_dir() / f"{pid}.json").unlink()


def make_registered_dir(prefix: str) -> tuple[Path, str]:
    """:func:`make_owned_dir`, entered in the registry at once (no service pid): an owner killed
    before its service started (during ``initdb`` or Kafka's format) leaves it to the next run's
    reaper rather than for good. :func:`unregister_dir` ends the entry."""
    path, token = make_owned_dir(prefix)
    entry = {
        "owner": os.getpid(),
        "owner_ticks": start_ticks(os.getpid()),
        "pid": None,
        "name": "directory",
        "dir": str(path),
        "token": token,
    }
    write_private(_dir_entry(path), json.dumps(entry))
    return path, token


def unregister_dir(path: Path) -> None:
    _dir_entry(path).unlink(missing_ok=True)


def _dir_entry(path: Path) -> Path:
    return registry_dir() / f"dir-{path.name}.json"


def _names_dir(pid: int, owned_dir: str | None) -> bool:
    """Guards against a recycled pid: the process must still mention its data directory."""
    if owned_dir is None:
        return True
    try:
        return owned_dir.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the registry


def _wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def reap_orphans() -> int:
    """Kill services whose owning process is gone; returns how many were killed."""
    killed = 0
    # Services first: a directory's own entry must not delete it under a running service.
    entries = sorted(registry_dir().glob("*.json"), key=lambda path: path.name.startswith("dir-"))
    for entry_path in entries:
        try:
            entry = json.loads(entry_path.read_text())
            owner = int(entry["owner"])
            pid = None if entry["pid"] is None else int(entry["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            entry_path.unlink(missing_ok=True)
            continue
        if alive(owner, _as_int(entry.get("owner_ticks"))):
            continue
        owned_dir = entry.get("dir") if isinstance(entry.get("dir"), str) else None
        if (
            pid is not None
            and alive(pid, _as_int(entry.get("ticks")))
            and _names_dir(pid, owned_dir)
        ):
            logger.warning("killing orphaned %s (pid %s)", entry.get("name"), pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            killed += 1
            _wait_gone(pid)
        if owned_dir is not None and os.path.lexists(owned_dir):  # both entries may name it
            token = entry.get("token")
            if isinstance(token, str) and is_own_dir(owned_dir, token):
                shutil.rmtree(owned_dir, ignore_errors=True)
            elif token is None:
                logger.info("leaving %s: the caller chose it, the dev stack did not", owned_dir)
            else:
                logger.warning(
                    "not deleting %s named by the service registry: the dev stack did not"
                    " create it (no matching marker in a temp outboxkit-* directory)",
                    owned_dir,
                )
        entry_path.unlink(missing_ok=True)
    return killed
