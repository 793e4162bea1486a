"""``outboxkit verify``'s writer processes honour ``[database] prepared_statements`` as the run's
relays and consumers do: behind a pooler that keeps no prepared statement (PgBouncer in
transaction mode before 1.21), a writer that prepared its statements after their fifth run would
meet "prepared statement ... does not exist" on another server connection. Before, the writer
always let psycopg prepare."""

from __future__ import annotations

import argparse
import io
import time

import pytest

from outboxkit.verify.writer import Writer

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("setting", "threshold"), [("false", None), ("true", 5)])
def test_the_writer_prepares_statements_only_when_the_settings_allow(
    outboxkit_db_url: str, monkeypatch: pytest.MonkeyPatch, setting: str, threshold: int | None
) -> None:
    monkeypatch.setenv("OUTBOXKIT_DATABASE_PREPARED_STATEMENTS", setting)
    args = argparse.Namespace(
        index=0,
        run_id="r",
        seed=1,
        topic=["t"],
        keys=4,
        rate=0.0,
        t0=time.time(),
        database_url=outboxkit_db_url,
        application_name="outboxkit-verify-writer",
    )
    writer = Writer(args, io.StringIO())
    try:
        with writer.engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert driver is not None
            assert driver.prepare_threshold == threshold
    finally:
        writer.engine.dispose()
