"""The database and schema of ``migrate``, ``outbox`` and ``inbox show|stats|cancel|purge``.

They come from :func:`outboxkit.settings.load_settings`, like every other command's: the TOML file
(``--config`` or ``OUTBOXKIT_CONFIG``), ``OUTBOXKIT_*`` variables and the secrets directory count,
the options given here win, and the answer is the one ``outboxkit config show`` prints. The options
read no variable and have no default of their own: either would outrank a secret file or hide the
settings' schema (a command that ran on the wrong schema), and ``--help`` shows no value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
from pydantic import SecretStr

from outboxkit.errors import OutboxkitError
from outboxkit.schema import validate_schema_name
from outboxkit.settings import load_database_settings

F = TypeVar("F", bound=Callable[..., Any])
# The most rows a listing's --limit asks for: refused by the option above it (a negative limit,
# or one past a bigint, failed in PostgreSQL instead: its error, not the option's).
LIMIT_MAX = 2**31 - 1

MISSING_URL = (
    "the database URL is not set (--database-url, OUTBOXKIT_DATABASE_URL, a file"
    " OUTBOXKIT_DATABASE_URL in $OUTBOXKIT_SECRETS_DIR, or [database] url in the TOML file)"
)


def finite(ctx: click.Context, param: click.Parameter, value: float) -> float:
    """A ``click.FloatRange`` callback: ``nan`` passes the range (every comparison with it is
    false)."""
    if not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number")
    return value


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="TOML settings file (default: $OUTBOXKIT_CONFIG).",
)
schema_option = click.option(
    "--schema",
    help="PostgreSQL schema of the outboxkit tables (default: the settings' schema:"
    " $OUTBOXKIT_SCHEMA, 'schema' in the TOML file, else outboxkit).",
)


def key_value_items(items: tuple[str, ...], option: str) -> list[tuple[str, str]]:
    """``key=value`` items of a repeatable option; an error names the item by its number, never
    its text (a value may be a secret, and an item without ``=`` may be nothing but one)."""
    pairs = []
    for number, item in enumerate(items, start=1):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(
                f"item {number} of {len(items)} is not key=value (its text is not shown)",
                param_hint=f"'{option}'",
            )
        pairs.append((name, value))
    return pairs


def database_url_option(
    help_text: str = "libpq URL of the database (default: the settings' URL:"
    " $OUTBOXKIT_DATABASE_URL, its file in $OUTBOXKIT_SECRETS_DIR, [database] url).",
) -> Callable[[F], F]:
    return click.option("--database-url", help=help_text)


def database_options(command: F) -> F:
    """``--config``, ``--database-url`` and ``--schema``, in that order."""
    for option in reversed((config_option, database_url_option(), schema_option)):
        command = option(command)
    return command


@dataclass(frozen=True)
class Database:
    """Where a command works: the database (``None``: set nowhere) and the schema."""

    url: SecretStr | None
    schema: str
    # psycopg's options from the ``[database]`` section (no prepared statements behind a pooler)
    connect_options: dict[str, Any] = field(default_factory=dict)

    def require_url(self) -> SecretStr:
        """The URL; not set anywhere is a usage error (exit 2) naming every place it may be."""
        if self.url is None:
            raise click.UsageError(MISSING_URL)
        return self.url


def resolve(config_path: str | None, database_url: str | None, schema: str | None) -> Database:
    """The settings' URL and schema, the options given overriding them. An invalid setting is
    an :class:`OutboxkitError` naming it, never quoting a value (nor the URL's password)."""
    if schema is not None:
        validate_schema_name(schema)  # the option's own error: "invalid schema name ..."
    settings = load_database_settings(
        config_path, overrides={"database": {"url": database_url}, "schema_name": schema}
    )
    url, options = settings.database.url, settings.database.connect_options()
    if url is None or not url.get_secret_value():
        return Database(None, settings.schema_name, options)
    # settings.database_url refuses an ambiguous URL
    return Database(settings.database_url, settings.schema_name, options)


def resolve_or_exit(
    config_path: str | None, database_url: str | None, schema: str | None
) -> Database:
    """:func:`resolve` with its error as click's one line (exit 1)."""
    try:
        return resolve(config_path, database_url, schema)
    except OutboxkitError as exc:
        message = str(exc).strip() or type(exc).__name__
    raise click.ClickException(message)  # outside the except block: no traceback context
