"""The ``outboxkit`` command line: one click group, one module per sub-command group.

Sub-command modules are imported only when their command runs, so ``outboxkit relay run`` does
not import the dev tooling (``dev``, ``demo``) or a Kafka client it does not use.

An :class:`~outboxkit.errors.OutboxkitError` escaping any command ends it in one line (``Error:
...``, exit 1), here once for all commands, rather than in a traceback: its messages are written
to be shown and never quote a secret, while a traceback's frames might.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import click

from outboxkit.errors import OutboxkitError

_COMMANDS = {
    "config": "outboxkit.cli.config:config",
    "demo": "outboxkit.cli.demo:demo",
    "dev": "outboxkit.cli.dev:dev",
    "inbox": "outboxkit.cli.inbox:inbox",
    "migrate": "outboxkit.cli.migrate:migrate",
    "outbox": "outboxkit.cli.outbox:outbox",
    "relay": "outboxkit.cli.relay:relay",
    "verify": "outboxkit.cli.verify:verify",
}


class OneLineErrors(click.Group):
    """A group whose commands end an :class:`OutboxkitError` in one line, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OutboxkitError as exc:
            message = str(exc).strip() or type(exc).__name__
        raise click.ClickException(message)  # outside the except block: no traceback context


class _LazyGroup(OneLineErrors):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*_COMMANDS, *super().list_commands(ctx)})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        spec = _COMMANDS.get(cmd_name)
        if spec is None:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = spec.partition(":")
        command: Any = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup)
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """outboxkit: the transactional outbox for PostgreSQL and Apache Kafka."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
