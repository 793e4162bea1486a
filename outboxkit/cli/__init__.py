"""The ``outboxkit`` command line: one click group, one module per sub-command group.

Sub-command modules are imported only when their command runs (or help lists them), so
``outboxkit migrate`` does not import the relay, the consumer or a Kafka client.
"""

from __future__ import annotations

import importlib
import logging

import click

# name -> "module:attribute" of the click command.
_COMMANDS = {
    "demo": "outboxkit.cli.demo:demo",
    "dev": "outboxkit.cli.dev:dev",
    "relay": "outboxkit.cli.relay:relay",
    "outbox": "outboxkit.cli.outbox:outbox",
    "migrate": "outboxkit.cli.migrate:migrate",
    "inbox": "outboxkit.cli.inbox:inbox",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = _COMMANDS[cmd_name].partition(":")
        command: click.Command = getattr(importlib.import_module(module), attribute)
        return command


@click.group(cls=_LazyGroup)
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """outboxkit: the transactional outbox for PostgreSQL and Apache Kafka."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
