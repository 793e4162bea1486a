"""``outboxkit relay shards N``: switches only when no row is pending or parked, and waits for
writers in flight, so no key's rows can be overtaken across shards."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from click.testing import CliRunner, Result

from outboxkit.cli import main
from tests.relay_support import (
    SCHEMA,
    insert_rows,
    payloads,
)

pytestmark = pytest.mark.integration


def _shards(db_url: str, count: int) -> Result:
    return CliRunner().invoke(main, ["relay", "shards", str(count), "--database-url", db_url])


def _count(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(f"SELECT shard_count FROM {SCHEMA}.outbox_setting").fetchone()
    assert row is not None
    return int(row[0])


def test_switches_when_idle_and_refuses_with_pending_or_parked_rows(
    outboxkit_db_url: str, outboxkit_topic: Callable[..., str]
) -> None:
    result = _shards(outboxkit_db_url, 4)
    assert result.exit_code == 0, result.output
    assert "now 4" in result.output
    assert _count(outboxkit_db_url) == 4

    ids = insert_rows(outboxkit_db_url, "t", payloads("k", 2))
    result = _shards(outboxkit_db_url, 2)
    assert result.exit_code == 1
    assert "refused: 2 pending row(s)" in result.output
    assert _count(outboxkit_db_url) == 4

    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {SCHEMA}.outbox_message SET state = 'parked' WHERE id = %s", (ids[0],)
        )
        conn.execute(
            f"UPDATE {SCHEMA}.outbox_message SET state = 'published' WHERE id = %s", (ids[1],)
        )
    result = _shards(outboxkit_db_url, 2)
    assert result.exit_code == 1
    assert "1 parked" in result.output
    assert "Traceback" not in result.output

    result = _shards(outboxkit_db_url, 0)
    assert result.exit_code == 2  # click's range check, before any SQL


def test_waits_for_a_writer_in_flight_then_sees_its_row(outboxkit_db_url: str) -> None:
    writer = psycopg.connect(outboxkit_db_url)  # a transaction that inserted, not yet committed
    insert_rows(writer, "t", payloads("k", 1))
    results: list[Result] = []
    switch = threading.Thread(target=lambda: results.append(_shards(outboxkit_db_url, 3)))
    switch.start()
    try:
        deadline = time.monotonic() + 10
        with psycopg.connect(outboxkit_db_url, autocommit=True) as watcher:
            while time.monotonic() < deadline:  # the switch is queued behind the writer's lock
                row = watcher.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND mode = 'ShareLock'"
                ).fetchone()
                if row and row[0]:
                    break
                time.sleep(0.02)
            else:
                pytest.fail("the switch never waited for the writer")
        writer.commit()
    finally:
        writer.close()
        switch.join(15)
    assert results
    assert results[0].exit_code == 1
    assert "refused: 1 pending" in results[0].output
    assert _count(outboxkit_db_url) == 1


def test_refuses_with_scheduled_rows(outboxkit_db_url: str) -> None:
    """A row the relay moved to 'scheduled' (migration 0008) still waits to be published: a
    new count would send it and newer rows of its key from different shards (found by review:
    the count changed, and a lowered one parked them as rows of no shard)."""
    [row_id] = insert_rows(outboxkit_db_url, "t", payloads("k", 1))
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {SCHEMA}.outbox_message SET state = 'scheduled',"
            " deliver_after = now() + interval '1 day' WHERE id = %s",
            (row_id,),
        )
    before = _count(outboxkit_db_url)
    result = _shards(outboxkit_db_url, before + 1)
    assert result.exit_code == 1
    assert "refused: 1 scheduled row(s)" in result.output
    assert "drain the pending and scheduled rows" in result.output
    assert _count(outboxkit_db_url) == before
