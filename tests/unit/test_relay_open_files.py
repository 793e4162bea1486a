"""A relay raises its soft open-files limit to what its shards need (up to the hard limit), and
says when even that is short. Under a soft limit of 1,024, 64 shards ran out of descriptors and
published nothing, with nothing at start-up to say why. Each case runs in a process of its own
with the limits set before it starts, so this test process keeps its own."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from outboxkit.relay.open_files import files_needed

pytestmark = pytest.mark.unit

RUN = """
import logging, resource, sys
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stdout)
from outboxkit.relay.open_files import ensure_open_files
ensure_open_files(64, 2, True)
print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def _run_with(soft: int, hard: int) -> str:
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    done = subprocess.run(
        [sys.executable, "-c", RUN], preexec_fn=limits, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_soft_limit_is_raised_to_what_the_shards_need() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = files_needed(64, 2, True)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the hard limit here ({hard}) is below what 64 shards need ({need})")
    out = _run_with(256, hard)
    assert f"open-files limit raised from 256 to {need} for 64 shard(s)" in out
    assert f"soft {need}" in out
    assert "WARNING" not in out


def test_a_hard_limit_too_low_is_said_once_with_the_figures() -> None:
    out = _run_with(256, 512)
    assert "open-files limit raised from 256 to 512" in out
    need = files_needed(64, 2, True)
    warnings = [line for line in out.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, out
    assert f"about {need} open files for 64 shard(s)" in warnings[0]
    assert "may open only 512 (hard limit 512)" in warnings[0]
    assert "soft 512" in out
