"""Options several command groups share, defined once so they read the same variable."""

from __future__ import annotations

import click

from outboxkit.schema import DEFAULT_SCHEMA

schema_option = click.option(
    "--schema",
    envvar="OUTBOXKIT_SCHEMA",
    default=DEFAULT_SCHEMA,
    show_default=True,
    help="PostgreSQL schema holding the outboxkit tables (default: $OUTBOXKIT_SCHEMA).",
)
