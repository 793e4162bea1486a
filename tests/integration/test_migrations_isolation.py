"""Concurrent `migrate up` on a database whose default isolation is REPEATABLE READ."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql

from outboxkit.db import migrator
from tests.support.migrate_cli import migrate_up_processes

pytestmark = pytest.mark.integration

WAITERS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def test_two_concurrent_migrate_up_under_a_repeatable_read_default(
    outboxkit_empty_db_url: str,
) -> None:
    """Both processes wait for the lock (held here), so the second one's first statement runs
    before the first one commits: a snapshot of that moment would show no migration applied."""
    url = outboxkit_empty_db_url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "ALTER DATABASE {} SET default_transaction_isolation = 'repeatable read'"
            ).format(sql.Identifier(str(conn.info.dbname)))
        )
    with psycopg.connect(url, autocommit=True) as watcher, psycopg.connect(url) as holder:
        assert holder.execute("SHOW transaction_isolation").fetchone() == ("repeatable read",)
        holder.execute("SELECT pg_advisory_xact_lock(hashtext('outboxkit.migrate.outboxkit'))")
        procs = migrate_up_processes(url, 2)
        deadline = time.monotonic() + 60
        while watcher.execute(WAITERS).fetchone() != (2,):
            assert time.monotonic() < deadline, "the two processes never waited for the lock"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        holder.rollback()  # releases the lock: one applies, the other waits for it again
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert sum(out.startswith("applied") for out, _ in outputs) == 1, outputs
    assert migrator.status(url).is_current
