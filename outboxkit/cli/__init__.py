"""The ``outboxkit`` command line: one click group, one module per sub-command group."""

from __future__ import annotations

import logging

import click

from outboxkit.cli.dev import dev


@click.group()
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """outboxkit: the transactional outbox for PostgreSQL and Apache Kafka."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


main.add_command(dev)
