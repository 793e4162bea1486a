"""``outboxkit dev``: run the self-started PostgreSQL + Kafka stack by hand."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import click

from outboxkit.devstack import DevStack
from outboxkit.devstack.process import cache_dir


def _state_file() -> Path:
    return cache_dir() / "dev-up.json"


@click.group()
def dev() -> None:
    """A throwaway PostgreSQL and Kafka for development (no Docker needed)."""


@dev.command()
@click.option("--durable", is_flag=True, help="Keep fsync on (for benchmarks).")
def up(durable: bool) -> None:
    """Start the stack in the foreground, print its URLs, stop on Ctrl-C or SIGTERM."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    with DevStack(durable=durable) as stack:
        _state_file().write_text(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "database_url": stack.database_url,
                    "kafka_bootstrap": stack.kafka_bootstrap,
                }
            )
        )
        click.echo(f"PostgreSQL: {stack.database_url}")
        click.echo(f"Kafka:      {stack.kafka_bootstrap}")
        for name, seconds in stack.startup_seconds.items():
            click.echo(f"  {name} started in {seconds:.1f}s")
        click.echo("Run `eval $(outboxkit dev env)` in another shell; Ctrl-C stops the stack.")
        try:
            while not stopping.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        finally:
            _state_file().unlink(missing_ok=True)
    click.echo("stopped")


@dev.command()
def env() -> None:
    """Print ``export`` lines for the stack that ``outboxkit dev up`` is running."""
    try:
        state = json.loads(_state_file().read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError) as exc:
        raise click.ClickException("no running `outboxkit dev up` found") from exc
    click.echo(f"export OUTBOXKIT_DATABASE_URL='{state['database_url']}'")
    click.echo(f"export OUTBOXKIT_KAFKA_BOOTSTRAP='{state['kafka_bootstrap']}'")
