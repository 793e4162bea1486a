"""``outboxkit demo``: the end-to-end demo on a self-started (or given) PostgreSQL + Kafka."""

from __future__ import annotations

import time

import click


@click.command()
@click.option("--orders", default=20, show_default=True, help="How many orders to write.")
def demo(orders: int) -> None:
    """Write -> relay -> Kafka -> deduplicating consumer, and check every invariant."""
    from outboxkit.demo import DemoInvariantError, run_demo
    from outboxkit.devstack import DevStack

    click.echo("Starting PostgreSQL and Kafka (self-started unless OUTBOXKIT_* URLs are set)...")
    started = time.monotonic()
    with DevStack() as stack:
        for name, seconds in stack.startup_seconds.items():
            click.echo(f"  {name} up in {seconds:.1f}s")
        try:
            run_demo(stack.database_url, stack.kafka_bootstrap, orders=orders, echo=click.echo)
        except DemoInvariantError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(f"Demo finished in {time.monotonic() - started:.1f}s; services stopped.")
