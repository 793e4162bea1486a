"""``outboxkit migrate``: apply, check and print the schema migrations."""

from __future__ import annotations

import sys
from typing import NoReturn

import click
import psycopg

from outboxkit import db
from outboxkit.cli.options import (
    Database,
    config_option,
    database_options,
    database_url_option,
    resolve,
    schema_option,
)
from outboxkit.db import migrator
from outboxkit.errors import OutboxkitError


def _fail(exc: Exception) -> NoReturn:
    """Exit 2 for every error: ``check`` exits 1 for "not current", nothing else may."""
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


def _database(config_path: str | None, database_url: str | None, schema: str | None) -> Database:
    """The settings' database and schema (options win), or the one-line error, exit 2."""
    try:
        return resolve(config_path, database_url, schema)
    except OutboxkitError as exc:
        _fail(exc)


@click.group()
def migrate() -> None:
    """The outboxkit schema: plain SQL migrations, applied under an advisory lock."""


@migrate.command()
@database_options
def up(config_path: str | None, database_url: str | None, schema: str | None) -> None:
    """Apply every pending migration (safe to run from many processes at once)."""
    target = _database(config_path, database_url, schema)
    schema = target.schema
    try:
        applied = migrator.upgrade(target.require_url(), schema)
    except (OutboxkitError, psycopg.Error) as exc:
        _fail(exc)
    if applied:
        click.echo(f"applied {', '.join(f'{v:04d}' for v in applied)} to schema {schema}")
    else:
        click.echo(f"schema {schema} is up to date (version {migrator.latest_version():04d})")


def _describe(current: migrator.MigrationStatus) -> list[str]:
    lines = [f"applied: {', '.join(f'{v:04d}' for v in current.applied) or '-'}"]
    if current.pending:
        lines.append(f"pending: {', '.join(f'{v:04d}' for v in current.pending)} (behind)")
    if current.unknown:
        lines.append(
            f"unknown: {', '.join(f'{v:04d}' for v in current.unknown)}"
            " (ahead of this outboxkit version)"
        )
    if current.changed:
        lines.append(f"changed: {', '.join(f'{v:04d}' for v in current.changed)} (edited files)")
    return lines


@migrate.command()
@database_options
def status(config_path: str | None, database_url: str | None, schema: str | None) -> None:
    """Show applied and pending migrations."""
    target = _database(config_path, database_url, schema)
    schema = target.schema
    try:
        current = migrator.status(target.require_url(), schema)
    except (OutboxkitError, psycopg.Error) as exc:
        _fail(exc)
    click.echo(f"schema {schema}, latest known version {migrator.latest_version():04d}")
    for line in _describe(current):
        click.echo(line)


@migrate.command()
@database_options
def check(config_path: str | None, database_url: str | None, schema: str | None) -> None:
    """Exit 0 if the schema is exactly current, 1 if behind, ahead or edited (2: an error)."""
    target = _database(config_path, database_url, schema)
    schema = target.schema
    try:
        current = migrator.status(target.require_url(), schema)
    except (OutboxkitError, psycopg.Error) as exc:
        _fail(exc)
    if current.is_current:
        click.echo(f"schema {schema} is current (version {migrator.latest_version():04d})")
        return
    for line in _describe(current):
        click.echo(line, err=True)
    sys.exit(1)


@migrate.command("sql")
@config_option
@database_url_option(
    "Print only what this database still needs (default: the settings' URL, if any; none:"
    " everything)."
)
@schema_option
@click.option("--after", type=int, default=None, help="Print migrations after this version.")
def sql_(
    config_path: str | None, database_url: str | None, schema: str | None, after: int | None
) -> None:
    """Print the SQL `up` would run, for a DBA to apply by hand."""
    target = _database(config_path, database_url, schema)
    try:
        if after is None:
            after = 0
            if target.url is not None:
                current = migrator.status(target.url, target.schema)
                migrator.refuse_unknown(current, target.schema)  # as `up`: exit 2
                after = max(current.applied, default=0)
        click.echo(migrator.render_sql(target.schema, after=after), nl=False)
    except (OutboxkitError, psycopg.Error) as exc:
        _fail(exc)


@migrate.command()
@click.option("--app", "app_role", default=None, help="Role of the application (writer).")
@click.option("--relay", "relay_role", default=None, help="Role of the relay.")
@click.option("--consumer", "consumer_role", default=None, help="Role of inbox consumers.")
@click.option("--apply", "do_apply", is_flag=True, help="Run them (as the schema owner).")
@database_options
def grants(
    app_role: str | None,
    relay_role: str | None,
    consumer_role: str | None,
    do_apply: bool,
    config_path: str | None,
    database_url: str | None,
    schema: str | None,
) -> None:
    """Print (or --apply) the least-privilege GRANTs for the given roles (docs/security.md)."""
    from outboxkit.db import grants as grant_sql

    roles = {
        k: v
        for k, v in (("app", app_role), ("relay", relay_role), ("consumer", consumer_role))
        if v
    }
    if not roles:
        raise click.UsageError("name at least one of --app, --relay, --consumer")
    target = _database(config_path, database_url, schema)
    schema = target.schema
    try:
        if not do_apply:
            click.echo(grant_sql.render(schema, roles), nl=False)
            return
        with db.connect(target.require_url()) as conn:
            count = grant_sql.apply(conn, schema, roles)
            loose = "app" in roles and grant_sql.app_may_set_state(conn, schema, roles["app"])
        click.echo(f"applied {count} grant(s) in schema {schema} to {', '.join(roles.values())}")
        if loose:
            click.echo(
                f"warning: role {roles['app']} may still INSERT {schema}.outbox_message.state"
                " (through PUBLIC, a role it belongs to, another grantor, or as the table's"
                " owner), so it could store a parked row: revoke that at its source",
                err=True,
            )
    except (OutboxkitError, ValueError, psycopg.Error) as exc:
        _fail(exc)
