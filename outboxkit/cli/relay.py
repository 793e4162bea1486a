"""``outboxkit relay run|pause|resume|status|shards``.

Settings come from :func:`outboxkit.settings.load_settings` (TOML file, ``OUTBOXKIT_*`` variables,
secret files); the options here override them. The connection options are accepted on the group
(``relay --config x run``) and on every command (``relay run --config x``); ``--help`` needs no
configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import logging
import signal
import socket
from collections.abc import Callable, Iterator
from datetime import UTC
from typing import Any, TypeVar

import click
import psycopg

from outboxkit import db
from outboxkit.cli import OneLineErrors
from outboxkit.errors import ConfigurationError, OutboxkitError
from outboxkit.gc_tuning import tune_gc
from outboxkit.relay.open_files import raise_open_files_limit
from outboxkit.settings import (
    KafkaClient,
    Mode,
    OnPublish,
    ParkedKeyPolicy,
    Settings,
    load_settings,
)

F = TypeVar("F", bound=Callable[..., Any])
_EXTRA_OF = {"confluent_kafka": "confluent", "aiokafka": "aiokafka", "prometheus_client": "metrics"}
_CONNECTION_KEYS = (
    "config_path",
    "database_url",
    "kafka_bootstrap",
    "kafka_client",
    "schema",
    "group",
)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in ("shard", "token", "reason"):
            if hasattr(record, name):
                entry[name] = getattr(record, name)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def _setup_logging(json_logs: bool) -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=logging.INFO)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    if json_logs:
        for handler in root.handlers:
            handler.setFormatter(_JsonFormatter())


def connection_options(command: F) -> F:
    """The options every relay command (and the group) accepts."""
    options = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(exists=True, dir_okay=False),
            help="TOML settings file (default: $OUTBOXKIT_CONFIG).",
        ),
        click.option("--database-url", help="libpq URL (default: $OUTBOXKIT_DATABASE_URL)."),
        click.option("--kafka-bootstrap", help="host:port,... ($OUTBOXKIT_KAFKA_BOOTSTRAP)."),
        click.option(
            "--kafka-client",
            "--producer",
            "kafka_client",
            type=click.Choice([c.value for c in KafkaClient]),
            help="Kafka client library ($OUTBOXKIT_KAFKA_CLIENT; default: confluent if installed).",
        ),
        click.option("--schema", help="Schema of the outboxkit tables ($OUTBOXKIT_SCHEMA)."),
        click.option("--group", help="Relay group ($OUTBOXKIT_RELAY_GROUP; default 'default')."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _settings(
    ctx: click.Context, given: dict[str, Any], relay: dict[str, Any] | None = None
) -> Settings:
    """Group options, then this command's (given ones win), over the loaded settings."""
    merged = dict(ctx.obj or {})
    merged.update({k: v for k, v in given.items() if v is not None})
    overrides = {
        "database": {"url": merged.get("database_url")},
        "kafka": {"bootstrap": merged.get("kafka_bootstrap"), "client": merged.get("kafka_client")},
        "schema_name": merged.get("schema"),
        "relay": {"group": merged.get("group"), **(relay or {})},
    }
    try:
        return load_settings(merged.get("config_path"), overrides=overrides)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    connection = {k: options.pop(k) for k in _CONNECTION_KEYS if k in options}
    return connection, options


@click.group(cls=OneLineErrors)  # also when run as ``python -m outboxkit.relay``
@connection_options
@click.pass_context
def relay(ctx: click.Context, /, **options: Any) -> None:
    """The fenced relay: outbox rows to Kafka."""
    ctx.obj = {k: v for k, v in options.items() if v is not None}


@relay.command()
@connection_options
@click.option("--shards", help="Comma-separated shard numbers to watch (default: all).")
@click.option("--mode", type=click.Choice([m.value for m in Mode]))
@click.option("--on-publish", type=click.Choice([o.value for o in OnPublish]))
@click.option("--parked-key-policy", type=click.Choice([p.value for p in ParkedKeyPolicy]))
@click.option("--batch-size", type=int)
@click.option("--poll-interval", type=float)
@click.option("--lease-ttl", type=float)
@click.option("--metrics-port", type=int)
@click.option("--metrics-host", help="Address the metrics endpoint binds (default 127.0.0.1).")
@click.option("--listen/--no-listen", default=None, help="LISTEN/NOTIFY hints (off for PgBouncer).")
@click.option("--json-logs", is_flag=True, help="One JSON object per log line.")
@click.pass_context
def run(ctx: click.Context, /, json_logs: bool, **options: Any) -> None:
    """Run the relay until SIGTERM/SIGINT."""
    connection, relay_options = _split(options)
    settings = _settings(ctx, connection, relay_options)
    if not settings.kafka.bootstrap:
        raise click.ClickException(
            "Kafka bootstrap servers are required (OUTBOXKIT_KAFKA_BOOTSTRAP, [kafka] bootstrap"
            " or --kafka-bootstrap)"
        )
    try:
        from outboxkit.relay.runner import Relay
    except ImportError as exc:
        extra = _EXTRA_OF.get((exc.name or "").partition(".")[0])
        if extra is None:  # not an optional extra: a broken or half-upgraded installation
            raise click.ClickException(
                f"the relay cannot start: {exc}; reinstall outboxkit with its dependencies"
            ) from None
        raise click.ClickException(
            f"the relay needs {exc.name}, which is not installed: pip install 'outboxkit[{extra}]'"
        ) from None
    _setup_logging(json_logs)
    if settings.relay.gc_tuning:  # a process of its own: collector settings for many rows
        tune_gc()
    raise_open_files_limit()  # a process of its own: an embedded relay leaves its host's alone

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await Relay(settings, stop=stop).run()

    try:
        asyncio.run(main())
    except OutboxkitError as exc:  # a missing client library, an unknown schema: one line
        raise click.ClickException(str(exc)) from None


def _connect(settings: Settings) -> psycopg.Connection[Any]:
    try:
        return db.connect(settings.database_url, **db.connect_timeout(settings.database_url))
    except (ConfigurationError, psycopg.Error) as exc:
        raise click.ClickException(str(exc)) from None


@contextlib.contextmanager
def _database_errors() -> Iterator[None]:
    """A database error as one line: its class and message, never a traceback or parameters."""
    try:
        yield
    except psycopg.Error as exc:
        raise click.ClickException(f"{type(exc).__name__}: {str(exc).strip()}") from None


def _control(settings: Settings, paused: bool, reason: str | None) -> None:
    group, schema = settings.relay.group, settings.schema_name
    with _database_errors(), _connect(settings) as conn:
        db.execute(
            conn,
            db.query("relay", "control_set", schema),
            {
                "group": group,
                "paused": paused,
                "reason": reason,
                "changed_by": f"{getpass.getuser()}@{socket.gethostname()}",
            },
        )
        ran = not paused or _group_ran(conn, group, schema)
    click.echo(f"relay group {group!r} {'paused' if paused else 'resumed'}")
    if not ran:
        click.echo(
            f"warning: no relay of group {group!r} has ever held a shard in schema {schema}:"
            " is the group name right (--group, OUTBOXKIT_RELAY_GROUP, [relay] group)? The pause"
            " is recorded and stops relays of that group when they start.",
            err=True,
        )


def _group_ran(conn: psycopg.Connection[Any], group: str, schema: str) -> bool:
    """Whether a relay of ``group`` ever held a shard here (a lease token on some shard; no
    backlog is walked: an empty "only"). A pause of a name no relay uses is likely a typo. An
    operator role that cannot read the leases gets no warning: the pause is done either way."""
    try:
        shards = db.rows(
            conn,
            db.query("relay", "status", schema),
            {"group": group, "holder": None, "only": [], "now": None},
        )
    except psycopg.Error:
        return True
    return any(row[2] is not None for row in shards)


@relay.command()
@connection_options
@click.option("--reason")
@click.pass_context
def pause(ctx: click.Context, /, reason: str | None, **options: Any) -> None:
    """Every relay of the group stops publishing within one poll interval."""
    _control(_settings(ctx, options), True, reason)


@relay.command()
@connection_options
@click.pass_context
def resume(ctx: click.Context, /, **options: Any) -> None:
    """Undo ``pause``."""
    _control(_settings(ctx, options), False, None)


@relay.command()
@connection_options
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, /, as_json: bool, **options: Any) -> None:
    """Each shard's holder, token, lease expiry, backlog and oldest pending age."""
    settings = _settings(ctx, options)
    group, schema = settings.relay.group, settings.schema_name
    with _database_errors(), _connect(settings) as conn:
        paused_row = db.one(conn, db.query("relay", "control_paused", schema), {"group": group})
        with conn.transaction():  # the backlog counted by walking the pending index (see SQL)
            db.execute(conn, db.query("relay", "pending_walk_only", schema))
            rows = db.rows(
                conn,
                db.query("relay", "status", schema),
                {"group": group, "holder": None, "only": None, "now": None},
            )
    paused = bool(paused_row and paused_row[0])
    shards = [
        {
            "shard": r[0],
            "holder": r[1] if r[4] else None,
            "token": r[2],
            "lease_expires_at": r[3].isoformat() if r[3] else None,
            "active": bool(r[4]),
            "backlog": int(r[5]),
            # Clamped: a row written by a transaction that began after this one looks younger
            # than its reader (a few microseconds below zero).
            "oldest_pending_seconds": None if r[6] is None else round(max(0.0, float(r[6])), 3),
            "parked": int(r[7]),
        }
        for r in rows
    ]
    if as_json:
        click.echo(json.dumps({"group": group, "paused": paused, "shards": shards}))
        return
    click.echo(f"group {group}  paused={paused}")
    click.echo(
        f"{'shard':>5} {'holder':<40} {'token':>7} {'lease_expires_at (UTC)':<22}"
        f" {'backlog':>8} {'oldest_s':>9} parked"
    )
    for s, r in zip(shards, rows, strict=True):
        oldest = s["oldest_pending_seconds"]
        expires = r[3].astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if r[3] else "-"
        click.echo(
            f"{s['shard']:>5} {s['holder'] or '-':<40} {s['token'] or '-':>7} {expires:<22}"
            f" {s['backlog']:>8} {oldest if oldest is not None else '-':>9} {s['parked']}"
        )


@relay.command()
@connection_options
@click.argument("count", type=click.IntRange(1, 1024))
@click.pass_context
def shards(ctx: click.Context, /, count: int, **options: Any) -> None:
    """Set the shard count, keeping per-key order: refused while rows are pending or parked.

    Run it as the schema owner. Writers wait (at most 5 s) while it checks and switches; restart
    the relays afterwards so they watch the new set of shards.
    """
    settings = _settings(ctx, options)
    schema = settings.schema_name
    with _database_errors(), _connect(settings) as conn, conn.transaction():
        db.execute(conn, db.query("relay", "shards_lock_timeout", schema))
        db.execute(conn, db.query("relay", "shards_lock_table", schema))
        blockers = db.rows(conn, db.query("relay", "shards_blockers", schema))
        if blockers:
            found = ", ".join(f"{int(n)} {state}" for state, n in blockers)
            raise click.ClickException(
                f"refused: {found} row(s) in schema {schema}. Changing the shard count moves"
                " keys to other shards, so rows written afterwards could overtake them."
                " Let the relay drain the pending and scheduled rows, retry or discard the"
                " parked ones (outboxkit outbox parked), then run this again."
            )
        row = db.one(conn, db.query("relay", "shards_set", schema), {"count": count})
    assert row is not None
    click.echo(
        f"shard count of schema {schema} is now {row[0]}; restart the relays so they watch"
        f" shards 0..{int(row[0]) - 1}"
    )
