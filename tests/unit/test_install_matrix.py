"""Each documented extra alone: the commands work, or fail with one line naming the extra.

A fresh virtualenv per extra would download from PyPI on every run; instead each command runs in
a child process in which the modules of the extras *not* installed cannot be imported
(``tests/support/blocked_imports``), which is what a user of that extra alone sees.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.blocking import env_without

# extra -> the top-level modules it installs (pyproject.toml [project.optional-dependencies])
EXTRAS = {
    "confluent": ("confluent_kafka",),
    "aiokafka": ("aiokafka",),
    "metrics": ("prometheus_client",),
    "otel": ("opentelemetry",),
    "alembic": ("alembic",),
}
INSTALLS = ["none", *EXTRAS]
COMMANDS = [
    ["--help"],
    ["relay", "run", "--help"],
    ["inbox", "run", "--help"],
    ["config", "show"],
    ["migrate", "sql"],
    ["outbox", "parked", "--help"],
]


def _env(install: str) -> dict[str, str]:
    blocked = [m for extra, mods in EXTRAS.items() if extra != install for m in mods]
    base = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
    return env_without(*blocked, base=base)


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "from outboxkit.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_extras_are_the_documented_ones() -> None:
    with open(os.path.join(os.path.dirname(__file__), "../../pyproject.toml")) as f:
        text = f.read()
    for extra in EXTRAS:
        assert f"\n{extra} = [" in text


@pytest.mark.parametrize("install", INSTALLS)
def test_commands_work_or_name_the_extra(install: str) -> None:
    env = _env(install)
    for args in COMMANDS:
        done = _run(args, env)
        output = done.stdout + done.stderr
        assert "Traceback" not in output, (install, args, output)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            assert len(lines) == 1, (install, args, output)
            assert "outboxkit[" in lines[0], (install, args, output)


@pytest.mark.parametrize("install", ["confluent", "aiokafka", "none"])
def test_the_relay_imports_without_prometheus_client(install: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import outboxkit.relay.runner as r; print(r.Relay.__name__)"],
        env=_env(install),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "Relay"
