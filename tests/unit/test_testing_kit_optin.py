"""The testing kit (dev stack, pytest fixtures) loads only for those who opt in."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

UNRELATED_TEST = textwrap.dedent(
    """
    import signal
    import sys


    def test_outboxkit_stays_out_of_an_unrelated_run():
        assert "outboxkit.pytest_plugin" not in sys.modules
        assert "outboxkit.devstack" not in sys.modules
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    """
)


def test_unrelated_pytest_run_is_untouched(tmp_path: Path) -> None:
    (tmp_path / "test_unrelated.py").write_text(UNRELATED_TEST)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_opting_in_provides_the_fixtures(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "outboxkit.pytest_plugin", "--fixtures"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outboxkit_db_url" in done.stdout
