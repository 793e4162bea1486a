"""The dev stack leaves nothing behind, even when its owner is SIGKILLed."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from outboxkit.devstack import DevStack
from outboxkit.devstack.process import _alive, reap_orphans


def _wait_dead(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_services_die_with_a_sigkilled_owner(tmp_path: object) -> None:
    script = textwrap.dedent("""
        import sys, time
        from outboxkit.devstack import PostgresServer
        pg = PostgresServer(); pg.start()
        print(pg.service.pid, flush=True)
        time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    postgres_pid = int(owner.stdout.readline())
    assert _alive(postgres_pid)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    owner.stdout.close()
    assert _wait_dead(postgres_pid), "postgres outlived its SIGKILLed owner"
    reap_orphans()  # the registry entry of the dead owner is cleaned up, not an error


def test_reap_orphans_kills_escaped_services() -> None:
    from outboxkit.devstack.process import _registry_dir

    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    entry = _registry_dir() / f"{sleeper.pid}.json"
    entry.write_text(f'{{"owner": {dead_owner.pid}, "pid": {sleeper.pid}, "name": "escaped"}}')
    assert reap_orphans() >= 1
    sleeper.wait(10)
    assert not entry.exists()


def test_restart_keeps_data(outboxkit_stack: DevStack) -> None:
    if outboxkit_stack.postgres is None:
        pytest.skip("external PostgreSQL (OUTBOXKIT_DATABASE_URL) cannot be restarted by tests")
    import psycopg

    url = outboxkit_stack.database_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS restart_probe (v int)")
        conn.execute("INSERT INTO restart_probe VALUES (42)")
    outboxkit_stack.postgres.restart()
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM restart_probe WHERE v = 42").fetchone() == (1,)
        conn.execute("DROP TABLE restart_probe")
