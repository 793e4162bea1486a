"""The dev stack leaves nothing behind, even when its owner is SIGKILLed; its secrets are never
readable by others; several `dev up` stacks can run side by side."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.devstack import DevStack, PostgresServer
from outboxkit.devstack.registry import alive, reap_orphans, registry_dir
from outboxkit.devstack.state import live_states

CLI = [sys.executable, "-c", "from outboxkit.cli import main; main()"]


def _wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
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
    assert alive(postgres_pid)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    owner.stdout.close()
    assert _wait_for(lambda: not alive(postgres_pid)), "postgres outlived its SIGKILLed owner"
    reap_orphans()  # the registry entry of the dead owner is cleaned up, not an error


def test_reap_orphans_kills_escaped_services() -> None:
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    entry = registry_dir() / f"{sleeper.pid}.json"
    entry.write_text(f'{{"owner": {dead_owner.pid}, "pid": {sleeper.pid}, "name": "escaped"}}')
    assert reap_orphans() >= 1
    sleeper.wait(10)
    assert not entry.exists()


def test_reaper_removes_the_data_dir_of_a_sigkilled_owner() -> None:
    script = textwrap.dedent("""
        import time
        from outboxkit.devstack import PostgresServer
        pg = PostgresServer(); pg.start()
        print(pg.base_dir, flush=True)
        time.sleep(600)
    """)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    base_dir = Path(owner.stdout.readline().strip())
    assert (base_dir / "data" / "PG_VERSION").exists()
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    owner.stdout.close()
    assert _wait_for(lambda: (reap_orphans() or True) and not base_dir.exists())


def test_reaper_removes_the_dir_of_an_owner_killed_before_its_server_started() -> None:
    """As one killed during initdb: no server pid was registered yet, the directory was."""
    script = textwrap.dedent("""
        import os, signal
        from outboxkit.devstack import PostgresServer
        pg = PostgresServer()
        print(pg.base_dir, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    owner = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert owner.returncode == -signal.SIGKILL
    base_dir = Path(owner.stdout.strip())
    assert base_dir.is_dir()
    reap_orphans()
    assert not base_dir.exists()


def test_password_file_is_never_readable_by_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even with umask 000, the file initdb reads the password from is 0600 while it exists."""
    seen: list[int] = []
    real_run = subprocess.run

    def spy(argv: list[str], *args: Any, **kwargs: Any) -> Any:
        for arg in argv:
            if arg.startswith("--pwfile="):
                seen.append(Path(arg.split("=", 1)[1]).stat().st_mode & 0o777)
        return real_run(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)  # the module postgres.py calls
    previous = os.umask(0)
    server = PostgresServer()
    try:
        server.start()
    finally:
        os.umask(previous)
        server.destroy()
    assert seen == [0o600]
    assert not (server.base_dir / "pwfile").exists()


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


def _shell_value(export_lines: str, name: str) -> str:
    out = subprocess.run(
        ["sh", "-c", f'{export_lines}\nprintf %s "${name}"'],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout


def test_dev_env_finds_its_stack_among_several(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each `dev up` has its own state; `dev env` takes the only live one or asks for --pid;
    services named by the environment are reported as external, not used silently."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("OUTBOXKIT_CACHE_DIR", str(cache))
    urls = {
        "a": "postgresql://a:it's-$(secret)@127.0.0.1:1/a",
        "b": "postgresql://b@127.0.0.1:1/b",
    }
    ups: dict[str, subprocess.Popen[bytes]] = {}
    runner = CliRunner()

    def start(name: str) -> None:
        env = {
            **os.environ,
            "OUTBOXKIT_DATABASE_URL": urls[name],
            "OUTBOXKIT_KAFKA_BOOTSTRAP": "127.0.0.1:1",
        }
        with (tmp_path / f"{name}.out").open("w") as out:
            ups[name] = subprocess.Popen(
                [*CLI, "dev", "up"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        pid = ups[name].pid
        assert _wait_for(lambda: pid in {s.pid for s in live_states()}, 60), (
            tmp_path / f"{name}.out"
        ).read_text()

    def stop(name: str) -> str:
        ups[name].send_signal(signal.SIGTERM)
        ups[name].wait(30)
        return (tmp_path / f"{name}.out").read_text()

    try:
        start("a")
        only = runner.invoke(main, ["dev", "env"])
        assert only.exit_code == 0, only.output
        assert _shell_value(only.stdout, "OUTBOXKIT_DATABASE_URL") == urls["a"]

        start("b")
        ambiguous = runner.invoke(main, ["dev", "env"])
        assert ambiguous.exit_code != 0
        assert ambiguous.stdout == ""
        for name in ("a", "b"):
            assert f"pid {ups[name].pid}" in ambiguous.stderr
        assert "--pid" in ambiguous.stderr
        assert "it's-$(secret)" not in ambiguous.stderr

        chosen = runner.invoke(main, ["dev", "env", "--pid", str(ups["b"].pid)])
        assert _shell_value(chosen.stdout, "OUTBOXKIT_DATABASE_URL") == urls["b"]

        output_a = stop("a")
        remaining = runner.invoke(main, ["dev", "env"])
        assert _shell_value(remaining.stdout, "OUTBOXKIT_DATABASE_URL") == urls["b"]
        output_b = stop("b")
    finally:
        for proc in ups.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for output in (output_a, output_b):
        assert "external, from OUTBOXKIT_DATABASE_URL; not started here" in output
        assert "external, from OUTBOXKIT_KAFKA_BOOTSTRAP; not started here" in output
        assert "stopped" in output
    assert "it's-$(secret)" not in output_a
    assert f"dev env --pid {ups['b'].pid}" in output_b
    assert list(cache.glob("dev-up-*.json")) == []
    gone = runner.invoke(main, ["dev", "env"])
    assert gone.exit_code != 0
    assert "no running" in gone.stderr
    assert shlex.quote(urls["a"]) != urls["a"]  # the URL really needed quoting
