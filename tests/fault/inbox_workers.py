"""``outboxkit inbox run`` as a real process, for the process-level consumer tests.

The fixtures that start them live in ``tests/fault/conftest.py``; this module holds what the
tests name in their signatures and assertions.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTBOXKIT = str(Path(sys.executable).parent / "outboxkit")  # the console script


class Worker:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    def output(self, tail: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-tail:]

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait_exit(self, timeout: float = 90) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"worker did not exit; log:\n{self.output()}") from exc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def fast_session(adapter: str) -> tuple[str, ...]:
    """A killed member is evicted after 6 s instead of the default 45 s."""
    if adapter == "confluent":
        return (
            "--kafka-option",
            "session.timeout.ms=6000",
            "--kafka-option",
            "heartbeat.interval.ms=1000",
        )
    return (
        "--kafka-option",
        "session_timeout_ms=6000",
        "--kafka-option",
        "heartbeat_interval_ms=1000",
    )
