"""``outboxkit dev``: run the self-started PostgreSQL + Kafka stack by hand."""

from __future__ import annotations

import os
import signal
import threading

import click

from outboxkit.devstack import DevStack
from outboxkit.devstack.kafka import Security
from outboxkit.devstack.stack import export_lines
from outboxkit.devstack.state import live_states, pick_state, write_state
from outboxkit.errors import DevStackError


@click.group()
def dev() -> None:
    """A throwaway PostgreSQL and Kafka for development (no Docker needed)."""


@dev.command()
@click.option("--durable", is_flag=True, help="Keep fsync on (for benchmarks).")
@click.option(
    "--kafka-security",
    type=click.Choice(["plaintext", "sasl_ssl"]),
    default="plaintext",
    show_default=True,
    help="sasl_ssl: clients must use TLS (a CA made at start-up) and a SCRAM-SHA-512 user.",
)
def up(durable: bool, kafka_security: str) -> None:
    """Start the stack in the foreground, print where it is, stop on Ctrl-C or SIGTERM.

    Passwords are not printed here; ``outboxkit dev env`` prints the variables that hold them.
    """
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    security: Security = "sasl_ssl" if kafka_security == "sasl_ssl" else "plaintext"
    try:
        stack = DevStack(durable=durable, kafka_security=security).start()
    except DevStackError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        others = [state.pid for state in live_states()]
        state_file = write_state(stack.env(), stack.describe())
        try:
            for line in stack.describe():
                click.echo(line)
            if others:
                click.echo(f"Other running stacks: pid {', '.join(map(str, others))}.")
                click.echo(f"Run `eval $(outboxkit dev env --pid {os.getpid()})`", nl=False)
            else:
                click.echo("Run `eval $(outboxkit dev env)`", nl=False)
            click.echo(" in another shell (it prints the passwords); Ctrl-C stops the stack.")
            try:
                while not stopping.wait(0.5):
                    pass
            except KeyboardInterrupt:
                pass
        finally:
            state_file.unlink(missing_ok=True)
    finally:
        stack.stop()
    click.echo("stopped")


@dev.command()
@click.option("--pid", type=int, help="Which `outboxkit dev up` (needed when several run).")
def env(pid: int | None) -> None:
    """Print ``export`` lines for the stack that ``outboxkit dev up`` is running."""
    try:
        state = pick_state(live_states(), pid)
    except DevStackError as exc:
        raise click.ClickException(str(exc)) from exc
    for line in export_lines(state.env):
        click.echo(line)
