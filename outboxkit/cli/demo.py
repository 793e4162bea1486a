"""``outboxkit demo``: failover and redelivery on a self-started (or given) PostgreSQL + Kafka.

The screen shows only the story and the verdict: every log (the services', the relays', the
consumer's, the Kafka clients') goes to files in a folder whose path is printed first.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import uuid
from collections.abc import MutableMapping
from pathlib import Path

import click

from outboxkit.cli.options import finite

# What a Kafka of one's own needs of OUTBOXKIT_KAFKA_*: which client, and its name.
_KAFKA_KEPT = ("OUTBOXKIT_KAFKA_CLIENT", "OUTBOXKIT_KAFKA_CLIENT_ID")


def forget_other_kafka(environ: MutableMapping[str, str]) -> list[str]:
    """With no ``OUTBOXKIT_KAFKA_BOOTSTRAP`` the demo starts a plaintext Kafka of its own: the
    other ``OUTBOXKIT_KAFKA_*`` variables (security, credentials, properties) describe another
    cluster, and its clients would fail on them. They are taken out of ``environ`` (so out of
    the relays' and consumer's too) -> their names, never their values."""
    if environ.get("OUTBOXKIT_KAFKA_BOOTSTRAP"):
        return []
    names = sorted(
        name for name in environ if name.startswith("OUTBOXKIT_KAFKA_") and name not in _KAFKA_KEPT
    )
    for name in names:
        del environ[name]
    return names


def _log_to(path: Path) -> None:
    """This process's logging (devstack, Kafka admin client) into a file, not the screen."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)


def _logs_in(log_dir: Path) -> None:
    """The folder made and the log opened, or one line saying why not (no traceback)."""
    error: OSError
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        _log_to(log_dir / "demo.log")
        return
    except OSError as exc:
        error = exc
    raise click.ClickException(f"cannot write the logs to {log_dir}: {error.strerror or error}")


@click.command()
@click.option(
    "--writers",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Concurrent writer threads.",
)
@click.option(
    "--orders",
    type=click.IntRange(1, 100_000),
    default=20,
    show_default=True,
    help="Orders each writer places.",
)
@click.option(
    "--seconds",
    type=click.FloatRange(0, 3600),
    callback=finite,
    default=10.0,
    show_default=True,
    help="Spread the writes over this.",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the logs go (default: a new temporary folder).",
)
def demo(writers: int, orders: int, seconds: float, log_dir: Path | None) -> None:
    """Writers, two relays (the active one SIGKILLed midway), a consumer killed between its
    DB commit and its offset commit; then a verification table. Exits 1 if a check fails."""
    from outboxkit.demo import DemoError, DemoOptions, Services, WritePlan, run_demo
    from outboxkit.devstack import DevStack
    from outboxkit.errors import ConfigurationError
    from outboxkit.settings import load_database_settings

    try:  # [database] prepared_statements, handed on to its relays and consumer
        prepared = load_database_settings().database.prepared_statements
    except ConfigurationError as exc:  # names the setting, never quotes its value
        raise click.ClickException(str(exc)) from None

    if log_dir is None:
        log_dir = Path(tempfile.mkdtemp(prefix="outboxkit-demo-"))
    _logs_in(log_dir)
    click.echo(f"outboxkit demo (logs: {log_dir})")
    click.echo(
        "Starting PostgreSQL and Kafka, unless OUTBOXKIT_* variables name running ones"
        " (a first run also fetches Kafka with Maven)..."
    )
    if ignored := forget_other_kafka(os.environ):
        click.echo(f"  ignoring {', '.join(ignored)}: they describe another Kafka, not its own")
    started = time.monotonic()
    plan = WritePlan(writers=writers, orders_per_writer=orders, seconds=seconds)
    with DevStack() as stack:
        up = [f"{name} self-started in {secs:.1f}s" for name, secs in stack.startup_seconds.items()]
        up += [f"{name} given by {variable}" for name, variable in stack.external.items()]
        click.echo(f"  {'; '.join(up)}")
        services = Services(
            stack.database_url,
            stack.kafka_bootstrap,
            uuid.uuid4().hex[:8],
            log_dir,
            prepared_statements=prepared,
        )
        try:
            result = run_demo(services, sys.stdout, DemoOptions(plan=plan))
        except DemoError as exc:
            raise click.ClickException(f"{exc} (logs: {log_dir})") from exc
    verdict = "all checks passed" if result.ok else "SOME CHECKS FAILED"
    click.echo(f"\n{verdict} in {time.monotonic() - started:.1f}s; services stopped.")
    if not result.ok:
        click.echo(f"Logs: {log_dir}")
        sys.exit(1)
