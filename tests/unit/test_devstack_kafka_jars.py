"""Two processes asking for the Kafka jars on an empty cache at once: one fetches, the other waits
for it and finds them complete. Each used to fetch, and the later one deleted the jars the
earlier one's JVM was starting from. Maven is replaced by a fetch the test lets finish."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest

from outboxkit.devstack.kafka_jars import KAFKA_VERSION

pytestmark = pytest.mark.unit

_CALLER = """
import os, sys
from outboxkit.devstack import kafka_jars

def fetch(mvn, pom, output, *extra, what):
    print("fetching", flush=True)
    output.mkdir()
    (output / "kafka.jar").write_text(str(os.getpid()))
    sys.stdin.readline()  # the test's go-ahead

kafka_jars.maven_copy_dependencies = fetch
kafka_jars.shutil.which = lambda name: "/usr/bin/mvn"
libs = kafka_jars.kafka_libs()
print("jars", *sorted(path.name for path in libs.iterdir()), flush=True)
"""


def _caller(cache: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OUTBOXKIT_CACHE_DIR": str(cache)}
    return subprocess.Popen(
        [sys.executable, "-c", _CALLER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _waits_on_a_lock(pid: int) -> bool:
    """``/proc/locks`` lists a process blocked in ``flock`` with ``->``."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[1] == "->" and fields[2] == "FLOCK" and fields[5] == str(pid):
            return True
    return False


def _readable(stream: IO[str], timeout: float) -> bool:
    return bool(select.select([stream], [], [], timeout)[0])


def test_a_second_process_waits_for_the_first_fetch_and_fetches_nothing(tmp_path: Path) -> None:
    first = _caller(tmp_path)
    second: subprocess.Popen[str] | None = None
    try:
        assert first.stdout is not None
        assert first.stdin is not None
        assert first.stdout.readline() == "fetching\n"
        second = _caller(tmp_path)
        assert second.stdout is not None
        deadline = time.monotonic() + 60
        while not _waits_on_a_lock(second.pid):
            assert time.monotonic() < deadline, "the second caller neither fetched nor waited"
            if _readable(second.stdout, 0.05):
                pytest.fail(f"the second caller did not wait: {second.stdout.readline()!r}")
        first.stdin.write("go\n")
        first.stdin.close()
        assert first.stdout.readline() == "jars kafka.jar\n"
        assert second.stdout.readline() == "jars kafka.jar\n"  # the first one's, complete
        assert first.wait(30) == 0
        assert second.wait(30) == 0
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()
                for stream in (proc.stdin, proc.stdout):
                    if stream is not None:
                        stream.close()
    assert (tmp_path / f"kafka-{KAFKA_VERSION}" / "complete").exists()
