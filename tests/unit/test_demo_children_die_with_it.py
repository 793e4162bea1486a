"""The demo's relay and consumer die with the demo: a SIGKILL (or SIGTERM) of the demo skips
its clean-up, and before, both went on running against servers that had died with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.waiting import wait_for

pytestmark = pytest.mark.unit

PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from outboxkit.demo.processes import DemoProcess

    child = DemoProcess("relay 1", [sys.executable, "-c", "import time; time.sleep(120)"],
                        {}, Path(sys.argv[1]))
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie is dead, only not reaped yet


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM])
def test_a_demo_child_dies_when_the_demo_is_killed(tmp_path: Path, kill: signal.Signals) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "relay.log")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ) as demo:
        try:
            assert demo.stdout is not None
            child = int(demo.stdout.readline())
            assert _alive(child)
            demo.send_signal(kill)
            demo.wait(30)
            wait_for(lambda: not _alive(child), what="the demo's child to end with it")
        finally:
            demo.kill()
