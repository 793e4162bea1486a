"""The dev stack's PostgreSQL starts and answers whatever the developer's environment holds: a
long TMPDIR, libpq variables that would send its clients elsewhere or demand what it lacks."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from outboxkit.devstack import PostgresServer


@pytest.fixture
def long_tmpdir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A TMPDIR of 90-odd characters (the server's OS user may traverse it)."""
    path = Path(tempfile.mkdtemp(prefix="outboxkit-test-long-tmpdir-" + "x" * 60))
    path.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_postgres_starts_in_a_long_tmpdir(long_tmpdir: Path) -> None:
    """A unix socket in its data directory would have a path over 107 bytes: it listens on TCP
    only."""
    server = PostgresServer()
    try:
        assert server.base_dir.parent == long_tmpdir
        assert len(str(server.base_dir / "sock" / f".s.PGSQL.{server.port}")) > 107
        server.start()
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.destroy()


def test_the_developers_libpq_variables_change_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each would make its clients (the readiness probe first) fail to reach the server."""
    monkeypatch.setenv("PGSSLMODE", "require")
    monkeypatch.setenv("PGGSSENCMODE", "require")
    monkeypatch.setenv("PGTARGETSESSIONATTRS", "standby")
    monkeypatch.setenv("PGHOSTADDR", "192.0.2.1")  # TEST-NET-1: would replace the host
    server = PostgresServer()
    try:
        server.start()
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.destroy()
