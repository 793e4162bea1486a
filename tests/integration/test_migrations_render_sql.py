"""`migrate sql --schema X` for a schema named by a reserved word applies as `migrate up`."""

from __future__ import annotations

import psycopg
import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.db import migrator

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("schema", ["user", "order"])
def test_rendered_sql_for_a_reserved_word_schema_applies(
    outboxkit_empty_db_url: str, schema: str
) -> None:
    script = migrator.render_sql(schema)
    with psycopg.connect(outboxkit_empty_db_url, autocommit=True) as conn:
        conn.execute(script.encode())  # as psql would run it: the server parses every line
    assert migrator.status(outboxkit_empty_db_url, schema).is_current
    assert migrator.upgrade(outboxkit_empty_db_url, schema) == []
    assert f'CREATE SCHEMA IF NOT EXISTS "{schema}";' in script
    printed = CliRunner().invoke(
        main, ["migrate", "sql", "--schema", schema], env={"OUTBOXKIT_DATABASE_URL": None}
    )
    assert (printed.exit_code, printed.stdout) == (0, script)
