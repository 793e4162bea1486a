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
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """An argument that is not UTF-8 (Python keeps its bytes as surrogates) is refused
        here, naming its position, never its text (it may be a password): further on it was
        sent to PostgreSQL, whose refusal blamed the connection's encoding settings."""
        for position, arg in enumerate(args, start=1):
            try:
                arg.encode("utf-8")
            except UnicodeEncodeError:
                raise click.UsageError(
                    f"argument {position} is not valid UTF-8 (its bytes are not shown)", ctx
                ) from None
        return super().parse_args(ctx, args)

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
