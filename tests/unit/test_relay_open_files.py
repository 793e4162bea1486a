"""``relay run`` raises its soft open-files limit to the hard one, and a relay says once, with
the figures, when its limit is below what its shards need. Under a soft limit of 1,024, 64
shards ran out of descriptors and published nothing, with nothing at start-up to say why. Each
case runs in a process of its own with the limits set before it starts, so this test process
keeps its own."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from outboxkit.relay.open_files import RAISED_AT_MOST, files_needed

pytestmark = pytest.mark.unit

PRELUDE = """
import logging, resource, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stdout)
from outboxkit.relay import open_files
"""


def _run_with(soft: int, hard: int, code: str) -> str:
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + code],
        preexec_fn=limits,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_relay_run_raises_the_soft_limit_to_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = RAISED_AT_MOST if hard == resource.RLIM_INFINITY else min(hard, RAISED_AT_MOST)
    if target <= 256:
        pytest.skip(f"the hard limit here ({hard}) leaves nothing to raise")
    code = (
        "open_files.raise_open_files_limit()\n"
        "print('soft', resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    out = _run_with(256, hard, code)
    assert f"open-files limit raised from 256 to {target}" in out
    assert f"soft {target}" in out


def test_a_limit_below_the_shards_need_is_said_once_with_the_figures() -> None:
    out = _run_with(512, 512, "open_files.check_open_files(64, 2)")
    warnings = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, out
    assert f"about {files_needed(64, 2)} open files for 64 shard(s)" in warnings[0]
    assert "may open only 512 (hard limit 512)" in warnings[0]


def test_one_producer_per_shard_needs_less() -> None:
    """At-least-once: one producer per shard, whatever producers_per_shard says."""
    assert files_needed(64, 1) < 1024 < files_needed(64, 2)
    assert _run_with(1024, 1024, "open_files.check_open_files(64, 1)") == ""
