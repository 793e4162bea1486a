"""``migrate sql`` on a schema ahead of this outboxkit, or with an edited migration, refuses as
``migrate up`` does (exit 2) instead of printing an empty script that says nothing is needed."""

from __future__ import annotations

import psycopg
import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.db import migrator

pytestmark = pytest.mark.integration

AHEAD = "INSERT INTO outboxkit.schema_migration (version, name, checksum) VALUES (%s, 'x', 'x')"
EDITED = "UPDATE outboxkit.schema_migration SET checksum = 'edited' WHERE version = 1"


@pytest.mark.parametrize("change", ["ahead", "edited"])
def test_sql_refuses_what_up_refuses(outboxkit_db_url: str, change: str) -> None:
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        if change == "ahead":
            conn.execute(AHEAD, (migrator.latest_version() + 1,))
        else:
            conn.execute(EDITED)
    env = {"OUTBOXKIT_DATABASE_URL": outboxkit_db_url}
    printed = CliRunner().invoke(main, ["migrate", "sql"], env=env)
    up = CliRunner().invoke(main, ["migrate", "up"], env=env)
    assert (printed.exit_code, up.exit_code) == (2, 2), printed.output
    assert printed.stdout == ""
    assert printed.stderr == up.stderr
    assert "does not know" in printed.stderr
    # no database asked: the whole script, as before
    alone = CliRunner().invoke(main, ["migrate", "sql"], env={"OUTBOXKIT_DATABASE_URL": None})
    assert alone.stdout == migrator.render_sql()
