"""``outboxkit demo`` run as a user runs it (a short story: 3 writers, 6 orders each, 3 s), and
the checks of its verification table."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTBOXKIT = str(Path(sys.executable).parent / "outboxkit")  # the console script


def run_demo(env: dict[str, str], log_dir: Path) -> str:
    """The demo's screen; fails the test unless it ended with status 0."""
    argv = [OUTBOXKIT, "demo", "--writers", "3", "--orders", "6", "--seconds", "3"]
    done = subprocess.run(
        [*argv, "--log-dir", str(log_dir)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    print(done.stdout)  # shown by pytest when the test fails: the story and the table
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    return done.stdout


def verification_table(out: str) -> str:
    """The table, every one of its 8 checks passed (the standby's takeover among them)."""
    assert "all checks passed" in out
    table = out.split("\nVerification\n", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("  ")]
    assert len(rows) == 8, table
    assert all(row.startswith("  \u2714") for row in rows), table
    assert re.search(r"took over from the killed one +\d+\.\ds after the SIGKILL", table), table
    return table
