"""``outboxkit config show``: the effective settings, every secret redacted.

What a process would run with, after defaults, the TOML file, ``OUTBOXKIT_*`` variables and
secret files: the quickest answer to "which value wins, and where does it come from?".
"""

from __future__ import annotations

import json
from typing import Any

import click

from outboxkit.errors import ConfigurationError
from outboxkit.settings import load_settings


@click.group()
def config() -> None:
    """Inspect outboxkit's settings."""


def _line(name: str, value: Any) -> str:
    """One ``name = value`` line that reads back as TOML; unset settings as a comment."""
    if value is None:
        return f"# {name} (not set)"
    if isinstance(value, dict):
        inline = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items())
        return f"{name} = {{{inline}}}"
    return f"{name} = {json.dumps(value)}"  # JSON scalars, lists and strings are TOML too


@config.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="TOML settings file (default: $OUTBOXKIT_CONFIG).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def show(config_path: str | None, as_json: bool) -> None:
    """Print the effective settings (secrets and the URL's password shown as ***)."""
    try:
        shown = load_settings(config_path).redacted()
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    click.echo(_line("schema", shown.pop("schema")))
    for section, values in shown.items():
        click.echo(f"\n[{section}]")
        for name, value in values.items():
            click.echo(_line(name, value))
