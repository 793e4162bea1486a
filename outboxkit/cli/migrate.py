"""``outboxkit migrate``: apply, check and print the schema migrations."""

from __future__ import annotations

import sys

import click
import psycopg

from outboxkit import db
from outboxkit.cli.options import schema_option
from outboxkit.db import migrator
from outboxkit.errors import OutboxkitError

_database_url = click.option(
    "--database-url",
    envvar="OUTBOXKIT_DATABASE_URL",
    required=True,
    help="libpq URL of the database (default: $OUTBOXKIT_DATABASE_URL).",
)


def _fail(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


@click.group()
def migrate() -> None:
    """The outboxkit schema: plain SQL migrations, applied under an advisory lock."""


@migrate.command()
@_database_url
@schema_option
def up(database_url: str, schema: str) -> None:
    """Apply every pending migration (safe to run from many processes at once)."""
    try:
        applied = migrator.upgrade(database_url, schema)
    except (OutboxkitError, psycopg.Error) as exc:
        _fail(exc)
        return
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
@_database_url
@schema_option
def status(database_url: str, schema: str) -> None:
    """Show applied and pending migrations."""
    try:
        current = migrator.status(database_url, schema)
    except (OutboxkitError, psycopg.Error) as exc:
        _fail(exc)
        return
    click.echo(f"schema {schema}, latest known version {migrator.latest_version():04d}")
    for line in _describe(current):
        click.echo(line)


@migrate.command()
@_database_url
@schema_option
def check(database_url: str, schema: str) -> None:
    """Exit 0 if the schema is exactly current, 1 if behind, ahead or edited."""
    try:
        current = migrator.status(database_url, schema)
    except (OutboxkitError, psycopg.Error) as exc:
        _fail(exc)
        return
    if current.is_current:
        click.echo(f"schema {schema} is current (version {migrator.latest_version():04d})")
        return
    for line in _describe(current):
        click.echo(line, err=True)
    sys.exit(1)


@migrate.command("sql")
@click.option(
    "--database-url",
    envvar="OUTBOXKIT_DATABASE_URL",
    default=None,
    help="Print only what this database still needs (default: everything).",
)
@schema_option
@click.option("--after", type=int, default=None, help="Print migrations after this version.")
def sql_(database_url: str | None, schema: str, after: int | None) -> None:
    """Print the SQL `up` would run, for a DBA to apply by hand."""
    try:
        if after is None:
            after = 0
            if database_url:
                applied = migrator.status(database_url, schema).applied
                after = max(applied, default=0)
        click.echo(migrator.render_sql(schema, after=after), nl=False)
    except (OutboxkitError, psycopg.Error) as exc:
        _fail(exc)


@migrate.command()
@click.option("--app", "app_role", default=None, help="Role of the application (writer).")
@click.option("--relay", "relay_role", default=None, help="Role of the relay.")
@click.option("--consumer", "consumer_role", default=None, help="Role of inbox consumers.")
@click.option("--apply", "do_apply", is_flag=True, help="Run them (as the schema owner).")
@click.option(
    "--database-url",
    envvar="OUTBOXKIT_DATABASE_URL",
    default=None,
    help="Needed with --apply (default: $OUTBOXKIT_DATABASE_URL).",
)
@schema_option
def grants(
    app_role: str | None,
    relay_role: str | None,
    consumer_role: str | None,
    do_apply: bool,
    database_url: str | None,
    schema: str,
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
    try:
        if not do_apply:
            click.echo(grant_sql.render(schema, roles), nl=False)
            return
        if not database_url:
            raise click.UsageError("--apply needs --database-url (or $OUTBOXKIT_DATABASE_URL)")
        with db.connect(database_url) as conn:
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
