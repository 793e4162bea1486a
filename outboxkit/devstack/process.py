"""A child service process that dies with its parent and can be stopped, killed and restarted.

Services are started with ``PR_SET_PDEATHSIG`` so a SIGKILLed test runner leaves no PostgreSQL or
Kafka behind; a registry of running services lets the next run clean up anything that still
escaped (another OS, a daemonised grandchild).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from outboxkit.devstack import registry
from outboxkit.errors import DevStackError

logger = logging.getLogger("outboxkit.devstack")

_PR_SET_PDEATHSIG = 1


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc: the registry still cleans up after a killed run
        return None


# Loaded and looked up once, in the parent: a dlopen or symbol look-up between fork and exec
# could wait for ever on a loader lock another thread held at the fork (the demo forks while
# its writer threads run).
_LIBC = _libc()
_PRCTL = getattr(_LIBC, "prctl", None)


def dies_with_parent() -> None:
    """A ``preexec_fn``: the child is SIGKILLed when the thread that started it ends (the
    demo's relay and consumer outlive a killed demo otherwise)."""
    if _PRCTL is not None:
        with contextlib.suppress(OSError):
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _die_with_parent() -> None:
    """Runs in the child between fork and exec; its own process group too."""
    dies_with_parent()
    os.setpgrp()


def free_port() -> int:
    """A TCP port on the loopback interface that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class ServiceProcess:
    """One long-running service: a command line, a log file, a readiness probe."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        ready: Callable[[], bool],
        *,
        env: dict[str, str] | None = None,
        user: str | None = None,
        start_timeout: float = 60.0,
        stop_signal: int = signal.SIGTERM,
        owned_dir: Path | None = None,
        dir_token: str | None = None,
        secrets: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.ready = ready
        self.env = env
        self.user = user
        self.start_timeout = start_timeout
        self.stop_signal = stop_signal
        # The command line names owned_dir (a recycled-pid guard); reap_orphans deletes it only
        # when dir_token proves the dev stack created it (see files.is_own_dir).
        self.owned_dir = owned_dir
        self.dir_token = dir_token
        self.secrets = [secret for secret in secrets if secret]  # masked in start's errors
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def is_running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.is_running():
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                user=self.user,
                preexec_fn=_die_with_parent,
            )
        finally:
            log.close()
        registry.register(self.proc.pid, self.name, self.owned_dir, self.dir_token)
        deadline = time.monotonic() + self.start_timeout
        last_failure = "none ran"
        while time.monotonic() < deadline:
            if not self.is_running():
                raise DevStackError(
                    f"{self.name} exited during start-up (code {self.proc.returncode});"
                    f" log tail:\n{log_tail(self.log_path)}"
                )
            try:
                if self.ready():
                    logger.info("%s ready (pid %s)", self.name, self.pid)
                    return
                last_failure = "the readiness probe answered not ready"
            except Exception as exc:  # readiness probes fail in many ways while starting
                last_failure = self._masked(f"{type(exc).__name__}: {exc}".strip())
                logger.debug("%s not ready yet: %s", self.name, last_failure)
            time.sleep(0.2)
        self.kill()
        # The probe's last failure first: a server whose log says it is ready but that its
        # clients cannot reach (a libpq variable of the developer's, say) is told why.
        raise DevStackError(
            f"{self.name} did not become ready within {self.start_timeout:.0f}s;"
            f" last probe: {last_failure}; log tail:\n{log_tail(self.log_path)}"
        )

    def _masked(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop; escalates to SIGKILL after ``timeout``."""
        if not self.is_running():
            return
        assert self.proc is not None
        self.proc.send_signal(self.stop_signal)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            logger.warning("%s ignored %s for %ss; killing", self.name, self.stop_signal, timeout)
            self.kill()
        if self.pid is not None:
            registry.unregister(self.pid)

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        if self.pid is not None:
            registry.unregister(self.pid)

    def pause(self) -> None:
        """SIGSTOP the whole process group (for zombie tests)."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGCONT)


def service_user() -> str | None:
    """PostgreSQL refuses to run as root; pick an unprivileged account when we are root."""
    if os.geteuid() != 0:
        return None
    import pwd  # Unix-only: imported where needed, so the package imports everywhere

    for candidate in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(candidate)
            return candidate
    raise DevStackError("running as root but no unprivileged user (postgres, nobody) exists")


def chown_tree(path: Path, user: str | None) -> None:
    if user is None:
        return
    import pwd

    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        shutil.chown(root, entry.pw_uid, entry.pw_gid)
        for name in dirs + files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid, follow_symlinks=False)


class ManagedServer:
    """Lifecycle shared by the dev stack's servers; subclasses build ``_service`` in ``start``.

    ``stop``/``kill``/``start`` keep the data directory, so tests can restart a server;
    ``destroy`` removes it.
    """

    base_dir: Path
    log_name: str
    stop_timeout: float = 30.0
    _service: ServiceProcess | None

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self._service is not None:
            self._service.stop(timeout=self.stop_timeout)

    def kill(self) -> None:
        if self._service is not None:
            self._service.kill()

    def freeze(self) -> None:
        """SIGSTOP the server: its connections stay open and nothing on them is answered, as
        behind a partition that sends no reset (a fault for tests; :meth:`thaw` ends it)."""
        if self._service is not None:
            self._service.pause()

    def thaw(self) -> None:
        """Continue what :meth:`freeze` stopped."""
        if self._service is not None:
            self._service.resume()

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def service(self) -> ServiceProcess | None:
        return self._service

    def log_tail(self) -> str:
        return log_tail(self.base_dir / self.log_name)

    def destroy(self) -> None:
        self.kill()
        shutil.rmtree(self.base_dir, ignore_errors=True)
        registry.unregister_dir(self.base_dir)
