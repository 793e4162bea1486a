"""The ``outboxkit`` command line: one click group, one module per sub-command group."""

from __future__ import annotations

import logging

import click

from outboxkit.cli.config import config
from outboxkit.cli.demo import demo
from outboxkit.cli.dev import dev
from outboxkit.cli.inbox import inbox
from outboxkit.cli.migrate import migrate
from outboxkit.cli.outbox import outbox
from outboxkit.cli.relay import relay


@click.group()
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """outboxkit: the transactional outbox for PostgreSQL and Apache Kafka."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


main.add_command(config)
main.add_command(demo)
main.add_command(dev)
main.add_command(relay)
main.add_command(outbox)
main.add_command(migrate)
main.add_command(inbox)
