"""`relay pause` of a group no relay ever ran in (a mistyped name) still records the pause, and
says that nothing of that name has run here."""

from __future__ import annotations

import psycopg
from click.testing import CliRunner

from outboxkit import db
from outboxkit.cli import main
from tests.relay_support import SCHEMA

WARNING = "warning: no relay of group"


def _pause(url: str, group: str) -> tuple[str, str]:
    result = CliRunner().invoke(
        main, ["relay", "pause", "--group", group], env={"OUTBOXKIT_DATABASE_URL": url}
    )
    assert result.exit_code == 0, result.output
    return result.stdout, result.stderr


def _paused(url: str, group: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = db.one(conn, db.query("relay", "control_paused", SCHEMA), {"group": group})
    return bool(row and row[0])


def test_pausing_a_group_that_never_ran_warns(outboxkit_db_url: str) -> None:
    out, err = _pause(outboxkit_db_url, "ordrs")
    assert "relay group 'ordrs' paused" in out
    assert f"{WARNING} 'ordrs' has ever held a shard in schema outboxkit" in err
    assert "--group" in err
    assert _paused(outboxkit_db_url, "ordrs")  # recorded all the same


def test_pausing_a_group_that_held_a_lease_does_not_warn(outboxkit_db_url: str) -> None:
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        row = db.one(
            conn,
            db.query("relay", "lease_acquire", SCHEMA),
            {"group": "orders", "shard": 0, "holder": "h", "ttl": 1, "now": None},
        )
        assert row is not None
        released = db.one(  # released since: the group still ran here
            conn,
            db.query("relay", "lease_release", SCHEMA),
            {"group": "orders", "shard": 0, "token": row[0]},
        )
        assert released is not None
    out, err = _pause(outboxkit_db_url, "orders")
    assert "relay group 'orders' paused" in out
    assert WARNING not in out + err
