"""``migrate``, ``outbox`` and ``inbox show|stats|cancel|purge`` read their database URL and schema
from the one settings model, like ``relay`` and ``config show``: the TOML file and the secrets
directory count, and options win. They once read only their options and two variables: a URL kept
in the secrets directory (as docs/security.md advises) was "missing", and a schema set in the TOML
file was ignored for the default one (the command worked on the wrong schema).

The database layer is replaced by recorders of the URL and schema each command would use.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result

from outboxkit import db
from outboxkit.cli import inbox as inbox_cli
from outboxkit.cli import inbox_common, main
from outboxkit.db import migrator

pytestmark = pytest.mark.unit

FILE_URL = "postgresql://ops:file-pw@file.example:5432/app"
ENV_URL = "postgresql://ops:env-pw@env.example:5432/app"
TOML_URL = "postgresql://ops:toml-pw@toml.example:5432/app"
OPTION_URL = "postgresql://ops:option-pw@option.example:5432/app"

COMMANDS = [
    ["migrate", "up"],
    ["migrate", "status"],
    ["migrate", "check"],
    ["migrate", "sql"],
    ["outbox", "parked"],
    ["outbox", "retry", "--all"],
    ["outbox", "discard", "--all"],
    ["inbox", "show"],
    ["inbox", "stats"],
    ["inbox", "purge", "--older-than", "60", "--all-consumers"],
    ["inbox", "cancel", "--consumer", "c", "--event-id", "e"],
]
IDS = [" ".join(c[:2]) for c in COMMANDS]
NEED_URL = [c for c in COMMANDS if c[:2] != ["migrate", "sql"]]  # sql: prints everything


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What the command handed the database layer: ``url`` and ``schema``."""
    found: dict[str, str] = {}

    def url_of(url: Any) -> str:
        return str(url.get_secret_value() if hasattr(url, "get_secret_value") else url)

    def status(url: Any, schema: str) -> migrator.MigrationStatus:
        found.update(url=url_of(url), schema=schema)
        return migrator.MigrationStatus((1,), (), (), ())

    def upgrade(url: Any, schema: str) -> list[int]:
        found.update(url=url_of(url), schema=schema)
        return []

    monkeypatch.setattr(migrator, "status", status)
    monkeypatch.setattr(migrator, "upgrade", upgrade)

    class Connection:
        def __enter__(self) -> Connection:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def transaction(self) -> Connection:
            return self

    def connect(url: Any, **options: Any) -> Connection:
        found["url"] = url_of(url)
        return Connection()

    real_query = db.query

    def query(area: str, name: str, schema: str) -> Any:
        found["schema"] = schema
        return real_query(area, name, schema)

    monkeypatch.setattr(db, "connect", connect)
    monkeypatch.setattr(db, "query", query)
    monkeypatch.setattr(db, "rows", lambda conn, query, params=None: [])

    class Engine:
        def dispose(self) -> None:
            return None

    def sync_engine(url: Any, **options: Any) -> Engine:
        found["url"] = url_of(url)
        return Engine()

    def reader(result: Any) -> Any:
        def read(*args: Any, schema: str, **kwargs: Any) -> Any:
            found["schema"] = schema
            return result

        return read

    monkeypatch.setattr(inbox_common, "sync_engine", sync_engine)
    monkeypatch.setattr(inbox_cli, "list_events", reader([]))
    monkeypatch.setattr(inbox_cli, "stats", reader([]))
    monkeypatch.setattr(
        inbox_cli, "purge_finished", reader(SimpleNamespace(messages=0, rejections=0, batches=0))
    )
    monkeypatch.setattr(inbox_cli, "cancel_event", reader(SimpleNamespace(cancelled=True)))
    return found


def _clean(**extra: str) -> dict[str, str | None]:
    """No OUTBOXKIT_* of the surrounding environment (a dev stack's URL, say), only ``extra``."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTBOXKIT_")}
    env.update(extra)
    return env


def _secrets(tmp_path: Path, url: str) -> str:
    directory = tmp_path / "secrets"
    directory.mkdir()
    (directory / "OUTBOXKIT_DATABASE_URL").write_text(url + "\n")  # as a mounted secret ends
    return str(directory)


def _toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "outboxkit.toml"
    path.write_text(text)
    return str(path)


def _with(args: list[str], *options: str) -> list[str]:
    """``options`` where the command takes them (``outbox`` takes them on the group)."""
    if args[0] == "outbox":
        return ["outbox", *options, *args[1:]]
    return [*args, *options]


def _invoke(args: list[str], env: dict[str, str | None]) -> Result:
    return CliRunner(env=env).invoke(main, args)


@pytest.mark.parametrize("args", COMMANDS, ids=IDS)
def test_a_url_in_the_secrets_directory_is_used(
    args: list[str], seen: dict[str, str], tmp_path: Path
) -> None:
    result = _invoke(args, _clean(OUTBOXKIT_SECRETS_DIR=_secrets(tmp_path, FILE_URL)))
    assert result.exit_code == 0, result.output
    assert seen == {"url": FILE_URL, "schema": "outboxkit"}


@pytest.mark.parametrize("args", COMMANDS, ids=IDS)
def test_the_schema_of_the_toml_file_is_used(
    args: list[str], seen: dict[str, str], tmp_path: Path
) -> None:
    toml = _toml(tmp_path, 'schema = "from_toml"\n')
    result = _invoke(args, _clean(OUTBOXKIT_CONFIG=toml, OUTBOXKIT_DATABASE_URL=ENV_URL))
    assert result.exit_code == 0, result.output
    assert seen == {"url": ENV_URL, "schema": "from_toml"}
    assert "schema outboxkit" not in result.output  # e.g. "schema from_toml is up to date"


@pytest.mark.parametrize("args", COMMANDS, ids=IDS)
def test_the_sources_rank_as_config_show_ranks_them(
    args: list[str], seen: dict[str, str], tmp_path: Path
) -> None:
    """TOML < variables < secret files; the ``--config`` option names the TOML file too."""
    toml = _toml(tmp_path, f'schema = "from_toml"\n[database]\nurl = "{TOML_URL}"\n')
    env = _clean(
        OUTBOXKIT_SECRETS_DIR=_secrets(tmp_path, FILE_URL),
        OUTBOXKIT_DATABASE_URL=ENV_URL,
        OUTBOXKIT_SCHEMA="from_env",
    )
    result = _invoke(_with(args, "--config", toml), env)
    assert result.exit_code == 0, result.output
    assert seen == {"url": FILE_URL, "schema": "from_env"}
    shown = json.loads(_invoke(["config", "show", "--json", "--config", toml], env).output)
    assert shown["schema"] == seen["schema"]
    assert shown["database"]["url"] == FILE_URL.replace("file-pw", "***")


@pytest.mark.parametrize("args", COMMANDS, ids=IDS)
def test_options_win_over_every_source(
    args: list[str], seen: dict[str, str], tmp_path: Path
) -> None:
    env = _clean(
        OUTBOXKIT_SECRETS_DIR=_secrets(tmp_path, FILE_URL),
        OUTBOXKIT_CONFIG=_toml(tmp_path, 'schema = "from_toml"\n'),
        OUTBOXKIT_DATABASE_URL=ENV_URL,
        OUTBOXKIT_SCHEMA="from_env",
    )
    result = _invoke(_with(args, "--database-url", OPTION_URL, "--schema", "from_option"), env)
    assert result.exit_code == 0, result.output
    assert seen == {"url": OPTION_URL, "schema": "from_option"}


@pytest.mark.parametrize("args", NEED_URL, ids=lambda a: " ".join(a[:2]))
def test_no_url_anywhere_is_one_line_naming_every_source(
    args: list[str], seen: dict[str, str]
) -> None:
    result = _invoke(args, _clean())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    error = [line for line in result.output.splitlines() if "rror" in line]
    assert len(error) == 1, result.output
    for source in ("--database-url", "OUTBOXKIT_DATABASE_URL", "OUTBOXKIT_SECRETS_DIR"):
        assert source in error[0]
    assert seen == {}


@pytest.mark.parametrize("args", COMMANDS, ids=IDS)
def test_an_ambiguous_url_in_a_secret_file_is_one_line_quoting_nothing(
    args: list[str], seen: dict[str, str], tmp_path: Path
) -> None:
    secrets = _secrets(tmp_path, "postgresql://app:Pa:ss@w0rd-LEAK7@127.0.0.1:1/app")
    result = _invoke(args, _clean(OUTBOXKIT_SECRETS_DIR=secrets))
    assert result.exit_code in (1, 2), result.output
    assert "Traceback" not in result.output
    assert "the database URL is invalid" in result.output
    assert "leak7" not in result.output.lower()
    assert seen == {}


def test_migrate_sql_and_grants_print_for_the_settings_schema(tmp_path: Path) -> None:
    """No database needed: the statements name the schema of the TOML file."""
    env = _clean(OUTBOXKIT_CONFIG=_toml(tmp_path, 'schema = "from_toml"\n'))
    for args in (["migrate", "sql"], ["migrate", "grants", "--app", "app"]):
        result = _invoke(args, env)
        assert result.exit_code == 0, result.output
        shown = result.output.replace('"', "")  # grants quote the schema
        assert "from_toml." in shown
        assert re.search(r"(?<!')outboxkit\.", shown) is None  # 'outboxkit.migrate.': a lock


def test_migrate_grants_apply_uses_the_settings_url(seen: dict[str, str], tmp_path: Path) -> None:
    from outboxkit.db import grants

    applied: list[str] = []
    env = _clean(
        OUTBOXKIT_SECRETS_DIR=_secrets(tmp_path, FILE_URL),
        OUTBOXKIT_CONFIG=_toml(tmp_path, 'schema = "from_toml"\n'),
    )

    def apply(conn: object, schema: str, roles: dict[str, str]) -> int:
        applied.append(schema)
        return len(roles)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grants, "apply", apply)
        patch.setattr(grants, "app_may_set_state", lambda conn, schema, role: False)
        result = _invoke(["migrate", "grants", "--app", "app", "--apply"], env)
    assert result.exit_code == 0, result.output
    assert (seen["url"], applied) == (FILE_URL, ["from_toml"])


def test_migrate_check_exits_2_for_a_settings_error_not_1(tmp_path: Path) -> None:
    """Exit 1 of ``check`` means "not current"; an invalid setting must not read as that."""
    env = _clean(OUTBOXKIT_DATABASE_URL=ENV_URL, OUTBOXKIT_SCHEMA="Not-A-Schema")
    result = _invoke(["migrate", "check"], env)
    assert result.exit_code == 2, result.output
    assert "OUTBOXKIT_SCHEMA" in result.output


@pytest.mark.parametrize(
    "path",
    [["migrate", "up"], ["migrate", "sql"], ["migrate", "grants"], ["outbox"], ["outbox", "parked"]]
    + [["inbox", name] for name in ("show", "stats", "purge", "cancel")],
    ids=" ".join,
)
def test_help_shows_no_setting_value(path: list[str], tmp_path: Path) -> None:
    env = _clean(
        OUTBOXKIT_SECRETS_DIR=_secrets(tmp_path, FILE_URL),
        OUTBOXKIT_CONFIG=_toml(tmp_path, 'schema = "from_toml"\n'),
        OUTBOXKIT_DATABASE_URL=ENV_URL,
    )
    result = _invoke([*path, "--help"], env)
    assert result.exit_code == 0, result.output
    for value in ("file-pw", "env-pw", "from_toml", "example", str(tmp_path)):
        assert value not in result.output


@pytest.mark.parametrize("args", COMMANDS, ids=IDS)
def test_settings_of_other_sections_cannot_stop_them(
    args: list[str], seen: dict[str, str], tmp_path: Path
) -> None:
    """A migrate job that shares its environment (or TOML file) with a relay or consumer reads
    the database and schema alone: a relay or Kafka setting it never uses, even one refused
    where it is used, does not stop it. A bad database setting still does."""
    toml = _toml(tmp_path, '[relay]\nunknown = 1\n[consumer]\nbatch_max_records = "x"\n')
    others = {
        "OUTBOXKIT_CONFIG": toml,
        "OUTBOXKIT_RELAY_LEASE_TTL": "0.5",
        "OUTBOXKIT_RELAY_FOO": "1",
        "OUTBOXKIT_KAFKA_SASL_USERNAME": "u",
        "OUTBOXKIT_CONSUMER_TOPICS": "[bad",
    }
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "OUTBOXKIT_KAFKA_SASL_PASSWORD").write_bytes(b"\xff\xfe not UTF-8")
    others["OUTBOXKIT_SECRETS_DIR"] = str(secrets)
    result = _invoke(args, _clean(OUTBOXKIT_DATABASE_URL=ENV_URL, **others))
    assert result.exit_code == 0, result.output
    assert seen == {"url": ENV_URL, "schema": "outboxkit"}
    bad = _invoke(args, _clean(OUTBOXKIT_DATABASE_URL=ENV_URL, OUTBOXKIT_DATABASE_FOO="1"))
    assert bad.exit_code != 0
    assert "OUTBOXKIT_DATABASE_FOO" in bad.output
