"""``migrate up`` waits for another process's migration and runs its own to the end whatever
``lock_timeout`` / ``statement_timeout`` the database or role sets for the application."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from outboxkit.db import migrator

pytestmark = pytest.mark.integration

WAITER = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND wait_event_type = 'Lock' AND clock_timestamp() - query_start > interval '300 ms'"
)


@pytest.mark.parametrize("setting", ["lock_timeout", "statement_timeout"])
def test_up_waits_for_the_lock_past_the_database_s_timeout(
    outboxkit_empty_db_url: str, setting: str
) -> None:
    name = conninfo_to_dict(outboxkit_empty_db_url)["dbname"]
    with psycopg.connect(outboxkit_empty_db_url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE \"{name}\" SET {setting} = '50ms'")
    outcome: list[object] = []

    def up() -> None:
        try:
            outcome.append(migrator.upgrade(outboxkit_empty_db_url))
        except Exception as exc:
            outcome.append(exc)

    options = "-c lock_timeout=0 -c statement_timeout=0"
    with psycopg.connect(outboxkit_empty_db_url, options=options) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(hashtext('outboxkit.migrate.outboxkit'))")
        runner = threading.Thread(target=up)
        runner.start()
        with psycopg.connect(outboxkit_empty_db_url, autocommit=True, options=options) as watch:
            deadline = time.monotonic() + 20
            while not outcome and time.monotonic() < deadline:  # waiting well past 50 ms
                row = watch.execute(WAITER).fetchone()
                if row and row[0]:
                    break
        holder.rollback()
    runner.join(timeout=30)
    assert outcome == [list(range(1, migrator.latest_version() + 1))]


def test_a_caller_s_transaction_gets_its_timeouts_back(outboxkit_empty_db_url: str) -> None:
    with psycopg.connect(outboxkit_empty_db_url) as conn:
        conn.execute("SET LOCAL lock_timeout = '7s'")
        conn.execute("SET LOCAL statement_timeout = '9s'")
        assert migrator.upgrade(conn)
        row = conn.execute(
            "SELECT current_setting('lock_timeout'), current_setting('statement_timeout')"
        ).fetchone()
        assert row == ("7s", "9s")
