"""The ``outboxkit`` command line: one click group, one module per sub-command group.

Sub-command modules are imported only when their command runs, so ``outboxkit relay run`` does
not import the dev tooling (``dev``, ``demo``) or a Kafka client it does not use.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import click

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


class _LazyGroup(click.Group):
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
