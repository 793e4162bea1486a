"""``outboxkit inbox``: run a consumer; read outcomes back, count them, cancel, purge old rows."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from outboxkit.cli.inbox_common import consumer_name as _consumer_name
from outboxkit.cli.inbox_common import engine_for as _engine
from outboxkit.cli.inbox_common import json_option as _json
from outboxkit.cli.inbox_common import jsonable as _jsonable
from outboxkit.cli.inbox_common import printable as _printable
from outboxkit.cli.inbox_replay import replay
from outboxkit.cli.options import LIMIT_MAX, database_options, finite, key_value_items
from outboxkit.inbox.readback import (
    cancel_event,
    get_event,
    list_events,
    list_rejections,
    stats,
)
from outboxkit.inbox.retention import purge_finished
from outboxkit.schema import InboxState
from outboxkit.settings import KafkaClient
from outboxkit.settings.models import CENTURY, MAX_RETENTION_BATCH


def _emit(rows: list[Any], as_json: bool, columns: list[str]) -> None:
    dicts = [{k: _jsonable(v) for k, v in dataclasses.asdict(r).items()} for r in rows]
    if as_json:
        click.echo(json.dumps(dicts, indent=2))
        return
    if not dicts:
        click.echo("(none)")
        return
    shown = [{c: _printable(d[c]) for c in columns} for d in dicts]
    widths = {c: max(len(c), *(len(d[c]) for d in shown)) for c in columns}
    click.echo("  ".join(c.ljust(widths[c]) for c in columns))
    for d in shown:
        click.echo("  ".join(d[c].ljust(widths[c]) for c in columns))


@click.group()
def inbox() -> None:
    """Consumer dedup rows: how each event ended for each consumer."""


@inbox.command()
@database_options
@_json
@click.option("--consumer", callback=_consumer_name, help="Only this consumer.")
@click.option("--event-id", help="One event (requires --consumer): full detail.")
@click.option(
    "--state",
    type=click.Choice([s.value for s in InboxState]),
)
@click.option("--rejections", is_flag=True, help="Show the rejection log instead.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(0, LIMIT_MAX))
def show(
    config_path: str | None,
    database_url: str | None,
    schema: str | None,
    as_json: bool,
    consumer: str | None,
    event_id: str | None,
    state: str | None,
    rejections: bool,
    limit: int,
) -> None:
    """Show inbox rows (newest first), one event in detail, or the rejection log."""
    with _engine(config_path, database_url, schema) as (engine, schema):
        if rejections:
            found = list_rejections(
                engine, consumer=consumer, event_id=event_id, limit=limit, schema=schema
            )
            cols = ["id", "consumer", "event_id", "reason", "topic", "kafka_partition"]
            _emit(found, as_json, [*cols, "kafka_offset", "created_at"])
            return
        if event_id is not None:
            if consumer is None:
                raise click.UsageError("--event-id needs --consumer")
            record = get_event(engine, consumer, event_id, schema=schema)
            if record is None:
                raise click.ClickException(f"no inbox row for {consumer}/{event_id}")
            detail = {k: _jsonable(v) for k, v in dataclasses.asdict(record).items()}
            if as_json:
                click.echo(json.dumps(detail, indent=2))
            else:
                for key, value in detail.items():
                    click.echo(f"{key:17} {_printable(value)}")
            return
        records = list_events(engine, consumer=consumer, state=state, limit=limit, schema=schema)
        columns = ["consumer", "event_id", "state", "attempts", "duplicate_count", "last_error"]
        _emit(records, as_json, [*columns, "updated_at"])


@inbox.command(name="stats")
@database_options
@_json
def stats_command(
    config_path: str | None, database_url: str | None, schema: str | None, as_json: bool
) -> None:
    """Counts per state per consumer (plus the rejection log)."""
    with _engine(config_path, database_url, schema) as (engine, schema):
        _emit(stats(engine, schema=schema), as_json, ["consumer", "state", "events", "duplicates"])


@inbox.command()
@database_options
@click.option("--consumer", required=True, callback=_consumer_name)
@click.option("--event-id", required=True)
@click.option("--reason", default="cancelled by operator", show_default=True)
@click.option(
    "--before-delivery", is_flag=True, help="Also cancel an event this consumer has not seen yet."
)
def cancel(
    config_path: str | None,
    database_url: str | None,
    schema: str | None,
    consumer: str,
    event_id: str,
    reason: str,
    before_delivery: bool,
) -> None:
    """Make an event cancelled; a running handler's late success is refused and rolled back."""
    with _engine(config_path, database_url, schema) as (engine, schema):
        result = cancel_event(
            engine,
            consumer,
            event_id,
            reason=reason,
            before_delivery=before_delivery,
            schema=schema,
        )
    if result.cancelled:
        click.echo(f"{consumer}/{event_id}: cancelled")
        return
    if result.state is None:
        raise click.ClickException(
            f"{consumer}/{event_id} not seen yet (use --before-delivery to cancel it anyway)"
        )
    raise click.ClickException(f"{consumer}/{event_id} already ended: {result.state}")


@inbox.command()
@database_options
@click.option(
    "--older-than",
    type=click.FloatRange(min=0, min_open=True, max=CENTURY),
    callback=finite,
    required=True,
    help="Window in seconds (above 0: rows of events finished just now recognise redeliveries).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1, max=MAX_RETENTION_BATCH),
    default=1000,
    show_default=True,
)
@click.option(
    "--consumer",
    callback=_consumer_name,
    help="Only this consumer's rows (its window: --older-than).",
)
@click.option("--all-consumers", is_flag=True, help="Every consumer's rows, with this one window.")
def purge(
    config_path: str | None,
    database_url: str | None,
    schema: str | None,
    older_than: float,
    batch_size: int,
    consumer: str | None,
    all_consumers: bool,
) -> None:
    """Delete terminal rows finished before the window, in small batches.

    Each consumer keeps its rows for its own window: name it (--consumer), or say that the
    window is every consumer's (--all-consumers)."""
    if (consumer is not None) == all_consumers:
        raise click.UsageError("give either --consumer NAME or --all-consumers")
    with _engine(config_path, database_url, schema) as (engine, schema):
        result = purge_finished(
            engine,
            consumer=consumer,
            window_seconds=older_than,
            batch_size=batch_size,
            schema=schema,
        )
    click.echo(
        f"deleted {result.messages} inbox rows and {result.rejections} rejections"
        f" in {result.batches} batches"
    )


_NUMBER_UNITS = ("ms", "bytes", "records")


def _number(name: str, value: str) -> str | int:
    """The value as the client takes it: text, except for a property counted in a unit.

    confluent-kafka hands every value to librdkafka as text, which parses numbers itself; only
    aiokafka needs an ``int``, for keyword arguments that all end in ``_ms``, ``_bytes`` or
    ``_records``. So a property whose last word is such a unit is a whole number (for both
    clients), and every other value stays the text given: a password of digits keeps its
    leading zeros and its length. Neither error quotes the value."""
    if name.replace(".", "_").rpartition("_")[2] not in _NUMBER_UNITS:
        return value
    digits = value.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):  # isdigit alone: '²', '٣' too
        raise click.BadParameter(
            f"{name!r} takes a whole number (its value is not shown)",
            param_hint="'--kafka-option'",
        )
    return int(value)


def _options(items: tuple[str, ...]) -> dict[str, str | int]:
    """``--kafka-option key=value`` items, numbers as numbers."""
    return {name: _number(name, value) for name, value in key_value_items(items, "--kafka-option")}


@inbox.command(name="run")
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="TOML settings file."
)
@click.option("--registry", help="module:EventRegistry whose @registry.handler functions run.")
@click.option("--handler", help="module:function for event types without a registry handler.")
@click.option("--consumer", "name", help="Consumer name (the dedup key's first part).")
@click.option("--group", help="Kafka consumer group id.")
@click.option("--topic", "topics", multiple=True, help="Topic to consume (repeatable).")
@click.option(
    "--adapter",
    type=click.Choice([c.value for c in KafkaClient]),
    help="Kafka client: confluent (sync driver) or aiokafka (asyncio); default: the installed one.",
)
@click.option("--database-url", help="PostgreSQL URL (default: $OUTBOXKIT_DATABASE_URL).")
@click.option("--bootstrap", help="Kafka bootstrap servers (default: $OUTBOXKIT_KAFKA_BOOTSTRAP).")
@click.option("--schema", "schema_name")
@click.option("--max-attempts", type=int)
@click.option("--retry-delay", type=float, help="First back-off, seconds.")
@click.option("--lease-seconds", type=float)
@click.option("--dead-letter", help="Dead-letter topic, '{topic}' is the source topic.")
@click.option("--acks-topic", help="Publish an acknowledgement per outcome here.")
@click.option(
    "--batch-max-records",
    type=int,
    help="Records processed in one database transaction (1: one at a time; default 50, max 64).",
)
@click.option("--batch-max-ms", type=float, help="Milliseconds to wait for a fuller batch.")
@click.option(
    "--offset-commit-interval", type=float, help="Seconds between offset commits (0: each)."
)
@click.option("--kafka-option", "config_items", multiple=True, help="Consumer property key=value.")
@click.option("--metrics-port", type=int, help="Serve Prometheus metrics on this port.")
@click.option("--metrics-host", help="Address of the metrics endpoint (default 127.0.0.1).")
@click.option(
    "--dedup-window",
    type=float,
    help="Seconds dedup rows are kept: checked against the topics' retention.ms (warns), and"
    " older replays of forgotten events are refused.",
)
@click.option(
    "--dead-letter-check",
    type=click.Choice(["fail", "warn", "off"]),
    help="A missing dead-letter topic at start-up: fail (default), warn, or do not check.",
)
@click.option(
    "--retention-window",
    type=float,
    help="Purge finished inbox rows and rejections older than this many seconds (default 7"
    " days; 0: off).",
)
@click.option(
    "--error-detail/--no-error-detail",
    default=None,
    help="Store full exception text (with SQL parameters) in last_error and dead letters.",
)
def run_command(
    config_path: str | None,
    adapter: str | None,
    database_url: str | None,
    bootstrap: str | None,
    topics: tuple[str, ...],
    config_items: tuple[str, ...],
    **given: Any,
) -> None:
    """Consume through the dedup middleware until SIGTERM (settings: OUTBOXKIT_CONSUMER_*,
    OUTBOXKIT_KAFKA_*, OUTBOXKIT_DATABASE_URL; options override them)."""
    from outboxkit.errors import ConfigurationError
    from outboxkit.gc_tuning import tune_gc
    from outboxkit.inbox import worker
    from outboxkit.settings import load_settings

    overrides = {k: v for k, v in given.items() if v is not None}
    schema = overrides.pop("schema_name", None)
    if topics:
        overrides["topics"] = list(topics)
    if config_items:
        overrides["kafka_options"] = _options(config_items)
    try:
        settings = load_settings(
            config_path,
            overrides={
                "consumer": overrides,
                "kafka": {"client": adapter, "bootstrap": bootstrap},
                "database": {"url": database_url},
                "schema": schema,
            },
        )
    except ConfigurationError as exc:  # names the settings, never echoes their values
        raise click.ClickException(str(exc)) from None
    if settings.consumer.gc_tuning:  # a process of its own: collector settings for many rows
        tune_gc()
    try:
        worker.run(settings)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc


inbox.add_command(replay)
