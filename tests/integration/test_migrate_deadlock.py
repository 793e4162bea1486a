"""`migrate up` from 0003 against a consumer whose handler writes outbox rows: the pending
migrations hold their locks until the one commit (0004's indexes take ``inbox_message``, 0005's
then waits for ``outbox_message``), and the handler's transaction holds ``outbox_message`` and
then marks its ``inbox_message`` row. PostgreSQL ends one side as a deadlock's victim; when it
is `migrate up`, it now runs again and applies everything once the other side committed.
Before, it failed with ``deadlock detected`` and the operator had to run it again."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from outboxkit.db import migrator
from tests.integration.test_migrations import _at_0003
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

WAITING_ON = """
SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)
WHERE NOT l.granted AND l.relation = to_regclass(%s) AND a.application_name = 'deadlock-migrate'
"""


def _migrate_waits_on(url: str, table: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(WAITING_ON, (table,)).fetchone()
        return row is not None and row[0] > 0


def test_migrate_up_runs_again_after_a_deadlock_with_a_handler_writing_outbox_rows(
    outboxkit_empty_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = outboxkit_empty_db_url
    _at_0003(url)
    # The migration's deadlock check runs once, deadlock_timeout after its wait began: 5 s, so
    # the handler's second lock (which closes the cycle) comes before it even on a loaded machine.
    options = "application_name=deadlock-migrate&options=-c%20deadlock_timeout%3D5s"
    migrate_url = url + ("&" if "?" in url else "?") + options
    result: dict[str, Any] = {}

    def migrate() -> None:
        try:
            result["applied"] = migrator.upgrade(migrate_url)
        except BaseException as exc:  # reported by the test
            result["error"] = exc

    with psycopg.connect(url) as handler:
        # The handler's transaction: its outbox row first (the lock an INSERT takes).
        handler.execute("SET deadlock_timeout = '60s'")  # the migration finds the deadlock
        handler.execute("LOCK TABLE outboxkit.outbox_message IN ROW EXCLUSIVE MODE")
        worker = threading.Thread(target=migrate, daemon=True)
        worker.start()
        wait_for(
            lambda: _migrate_waits_on(url, "outboxkit.outbox_message"),
            what="migrate up waiting on outbox_message",
        )
        # Then its mark of the inbox row: a deadlock, which the migration's check finds first.
        handler.execute("LOCK TABLE outboxkit.inbox_message IN ROW EXCLUSIVE MODE")
        wait_for(
            lambda: _migrate_waits_on(url, "outboxkit.inbox_message") or not worker.is_alive(),
            what="migrate up running again (waiting on inbox_message)",
        )
        assert "error" not in result, result.get("error")
        handler.commit()
    worker.join(60)
    assert not worker.is_alive()
    assert "error" not in result, result.get("error")
    assert result["applied"] == list(range(4, migrator.latest_version() + 1))
    assert migrator.status(url).is_current
    assert "deadlock detected" in caplog.text
    assert "running it again (run 2 of 5)" in caplog.text
