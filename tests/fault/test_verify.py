"""``outboxkit verify`` end to end: a 60 s fault-injection run on the session's PostgreSQL and
Kafka must pass, with at least five kinds of fault injected, and print only its summary.

The session's servers are shared with other tests, so the run treats them as external: it kills,
stops and re-arms its own relays and consumers, forces rebalances and terminates its own
backends, but restarts no server (the self-started kinds are covered by ``--dev`` runs).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from outboxkit.verify import History, check
from tests.support.env import service_env

pytestmark = pytest.mark.fault

ROOT = Path(__file__).resolve().parents[2]
OUTBOXKIT = str(Path(sys.executable).parent / "outboxkit")


def test_verify_60s_run_passes_with_five_fault_kinds(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, tmp_path: Path
) -> None:
    env = service_env(outboxkit_db_url, outboxkit_kafka_bootstrap, PYTHONPATH=str(ROOT))
    history_file = tmp_path / "history.json"
    command = [OUTBOXKIT, "verify", "--duration", "60s", "--seed", "20261202"]
    command += ["--writers", "2", "--consumers", "2", "--history", str(history_file)]
    result = subprocess.run(
        command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=420, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "result      PASS" in result.stdout

    history = History.from_json(history_file.read_bytes())
    kinds = {fault.kind for fault in history.faults}
    assert len(kinds) >= 5, f"fault kinds injected: {sorted(kinds)}\n{output}"
    faults_line = next(line for line in result.stdout.splitlines() if line.startswith("faults"))
    assert all(kind in faults_line for kind in kinds)
    report = check(history, exactly_once=True)
    assert report.ok
    totals = report.totals
    assert totals.committed > 100, output
    assert totals.consumed > 100, output
    assert min(totals.rolled_back, totals.duplicates, totals.rejected) > 0, output
    # Only the summary: no client library log line, no traceback.
    for noise in ("librdkafka", "aiokafka", "Traceback", "WARNING", "ERROR"):
        assert noise not in output, output

    # The written history is checked again on its own, as a replay of a failing seed would be.
    again = subprocess.run(
        [OUTBOXKIT, "verify", "--check", str(history_file)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "result      PASS" in again.stdout
