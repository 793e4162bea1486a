"""The database commands against a real database, configured the way docs/security.md advises:
the URL only in the secrets directory, the schema only in the TOML file. ``migrate``, ``outbox``
and ``inbox`` once failed ("Missing option '--database-url'") or, given the URL, worked on the
default schema instead of the TOML file's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner, Result

from outboxkit.cli import main

pytestmark = pytest.mark.integration


def _invoke(args: list[str], env: dict[str, str | None]) -> Result:
    return CliRunner(env=env).invoke(main, args)


def test_the_commands_follow_the_secrets_directory_and_the_toml_file(
    outboxkit_empty_db_url: str, tmp_path: Path
) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "OUTBOXKIT_DATABASE_URL").write_text(outboxkit_empty_db_url + "\n")
    toml = tmp_path / "outboxkit.toml"
    toml.write_text('schema = "from_toml"\n')
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTBOXKIT_")}
    env.update(OUTBOXKIT_SECRETS_DIR=str(secrets), OUTBOXKIT_CONFIG=str(toml))

    up = _invoke(["migrate", "up"], env)
    assert up.exit_code == 0, up.output
    assert "to schema from_toml" in up.output
    for args in (
        ["migrate", "check"],
        ["outbox", "parked", "--json"],
        ["inbox", "stats", "--json"],
        ["inbox", "purge", "--older-than", "60", "--all-consumers"],
        ["relay", "status", "--json"],  # it always read the settings: they agree now
    ):
        result = _invoke(args, env)
        assert result.exit_code == 0, (args, result.output)
    assert json.loads(_invoke(["outbox", "parked", "--json"], env).output) == []

    other = _invoke(["migrate", "check", "--schema", "outboxkit"], env)  # the option wins
    assert other.exit_code == 1, other.output
    with psycopg.connect(outboxkit_empty_db_url) as conn:
        names = {
            row[0]
            for row in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname IN ('from_toml', 'outboxkit')"
            )
        }
    assert names == {"from_toml"}  # nothing ran on the default schema
