"""The processes of a verify run: writers, relays and consumers, each with its own log file.

Their output goes to files in the run's directory, never to the terminal: the run prints only
its summary. A process the nemesis killed is started again by :meth:`Fleet.supervise`, the way a
process supervisor (systemd, Kubernetes) would; a process that SIGKILLed itself at an armed
``OUTBOXKIT_FAULT`` point is recorded as that fault when it is found dead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from outboxkit.devstack.process import _die_with_parent
from outboxkit.faults import FAULT_ENV

RESTART_DELAY = 1.0  # seconds a killed process stays down before it is started again


@dataclass
class Child:
    """One process of the run; ``argv``/``env`` start it again the same way."""

    name: str
    role: str  # "writer", "relay", "consumer" or "extra-consumer"
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    stopped: bool = False  # SIGSTOPped by the nemesis, not yet continued
    fault: str | None = None  # the OUTBOXKIT_FAULT armed in the running process
    next_fault: str | None = None  # to arm when it is next started
    expected_exit: bool = False  # we killed or stopped it on purpose
    down_since: float | None = None
    starts: int = 0

    def start(self, fault: str | None = None) -> None:
        env = dict(self.env)
        env.pop(FAULT_ENV, None)
        if fault:
            env[FAULT_ENV] = fault
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts + 1} fault={fault}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        self.fault, self.stopped, self.expected_exit = fault, False, False
        self.down_since = None
        self.starts += 1

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum: int) -> bool:
        if not self.running:
            return False
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signum)
            return True
        return False

    def kill(self) -> bool:
        self.expected_exit = True
        self.stopped = False
        return self.signal(signal.SIGKILL)

    def pause(self) -> bool:
        self.stopped = self.signal(signal.SIGSTOP)
        return self.stopped

    def resume(self) -> None:
        if self.stopped:
            self.signal(signal.SIGCONT)
            self.stopped = False

    def ask_to_stop(self) -> None:
        """SIGCONT (a stopped process cannot act on SIGTERM) and SIGTERM."""
        self.expected_exit = True
        self.stopped = False
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float) -> None:
        """Wait for the exit; SIGKILL when it takes longer than ``timeout``."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 30.0) -> None:
        self.ask_to_stop()
        self.wait_stopped(timeout)


FaultHit = Callable[[Child, str], None]


@dataclass
class Fleet:
    """Every child of the run; ``supervise`` restarts the relays and consumers that died."""

    children: list[Child] = field(default_factory=list)
    restarts: int = 0
    unexpected_exits: list[str] = field(default_factory=list)

    def add(self, child: Child) -> Child:
        self.children.append(child)
        return child

    def of(self, *roles: str) -> list[Child]:
        return [c for c in self.children if c.role in roles]

    def supervise(self, on_fault_hit: FaultHit, *, restart: bool = True) -> None:
        now = time.monotonic()
        for child in self.of("relay", "consumer"):
            if child.proc is None or child.running:
                continue
            if child.down_since is None:
                child.down_since = now
                code = child.proc.returncode
                if child.fault and code == -signal.SIGKILL and not child.expected_exit:
                    on_fault_hit(child, child.fault)
                elif not child.expected_exit:
                    self.unexpected_exits.append(f"{child.name} exited with code {code}")
            if restart and now - child.down_since >= RESTART_DELAY:
                child.start(child.next_fault)
                child.next_fault = None
                self.restarts += 1

    def resume_all(self) -> None:
        for child in self.children:
            child.resume()

    def stop(self, *roles: str, timeout: float = 30.0) -> None:
        """Ask all of them at once, then wait for each (SIGKILL after ``timeout``)."""
        chosen = self.of(*roles) if roles else self.children
        for child in chosen:
            child.ask_to_stop()
        deadline = time.monotonic() + timeout
        for child in chosen:
            child.wait_stopped(max(0.1, deadline - time.monotonic()))


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
