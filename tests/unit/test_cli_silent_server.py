"""Every command that opens a connection gives up on a server that accepts it and never
answers (frozen, behind a partition): the default ``connect_timeout`` reaches them all."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.unit

COMMANDS = [
    ["migrate", "up"],
    ["migrate", "status"],
    ["migrate", "check"],
    ["migrate", "sql"],
    ["migrate", "grants", "--relay", "relay_role", "--apply"],
    ["outbox", "parked"],
    ["outbox", "retry", "1"],
    ["outbox", "discard", "1"],
    ["inbox", "show"],
    ["inbox", "stats"],
    ["inbox", "cancel", "--consumer", "c", "--event-id", "e"],
    ["inbox", "purge", "--older-than", "60", "--all-consumers"],
    ["relay", "status"],
]
# The default lowered to libpq's minimum, as the URL cannot say it (its own timeout wins).
RUN = (
    "import sys; import outboxkit.db.abandon as a; a.CONNECT_TIMEOUT_SECONDS = 2;"
    " from outboxkit.cli import main; sys.argv = ['outboxkit', *sys.argv[1:]]; main()"
)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listener the kernel completes connections for; nothing ever reads or answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield int(listener.getsockname()[1])


def test_every_command_gives_up_on_a_silent_server(silent_port: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "OUTBOXKIT_"))}
    env["OUTBOXKIT_DATABASE_URL"] = f"postgresql://u:pw@127.0.0.1:{silent_port}/db"
    started = {
        " ".join(cmd): subprocess.Popen(
            [sys.executable, "-c", RUN, *cmd],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cmd in COMMANDS
    }
    stuck = []
    # 2 s each, in parallel; the rest is Python starting 13 processes on a machine that may be
    # busy (30 s fell short once). A command that does not give up waits for ever.
    deadline = time.monotonic() + 120
    for name, proc in started.items():
        try:
            _, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            stuck.append(name)
            continue
        assert proc.returncode != 0, name
        assert "timeout" in err, (name, err)
        assert "Traceback" not in err, (name, err)
    assert stuck == []
