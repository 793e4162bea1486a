"""``outboxkit relay run|pause|resume|status``."""

from __future__ import annotations

import asyncio
import getpass
import json
import logging
import signal
import socket
from typing import Any

import click
import psycopg

from outboxkit.errors import ConfigurationError
from outboxkit.db.queries import query
from outboxkit.relay.config import RelayConfig, load_config


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in ("shard", "token"):
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


def _config(ctx_obj: dict[str, Any], **overrides: Any) -> RelayConfig:
    options = {k: v for k, v in ctx_obj.items() if k != "config_path"}
    try:
        return load_config(ctx_obj.get("config_path"), overrides={**options, **overrides})
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False))
@click.option("--database-url", envvar="OUTBOXKIT_DATABASE_URL", show_envvar=True)
@click.option("--kafka-bootstrap", envvar="OUTBOXKIT_KAFKA_BOOTSTRAP", show_envvar=True)
@click.option("--schema", "schema_name", default=None)
@click.option("--group", "relay_group", default=None, help="Relay group (default 'default').")
@click.pass_context
def relay(ctx: click.Context, /, config_path: str | None, **options: Any) -> None:
    """The fenced relay: outbox rows to Kafka."""
    ctx.obj = {"config_path": config_path, **{k: v for k, v in options.items() if v is not None}}


@relay.command()
@click.option("--shards", help="Comma-separated shard numbers to watch (default: all).")
@click.option("--mode", type=click.Choice(["exactly_once", "at_least_once"]))
@click.option("--on-publish", type=click.Choice(["mark", "delete"]))
@click.option("--parked-key-policy", type=click.Choice(["wait", "skip"]))
@click.option("--producer", type=click.Choice(["confluent", "aiokafka"]))
@click.option("--batch-size", type=int)
@click.option("--poll-interval", type=float)
@click.option("--lease-ttl", type=float)
@click.option("--metrics-port", type=int)
@click.option("--listen/--no-listen", default=None, help="LISTEN/NOTIFY hints (off for PgBouncer).")
@click.option("--json-logs", is_flag=True, help="One JSON object per log line.")
@click.pass_obj
def run(obj: dict[str, Any], /, shards: str | None, json_logs: bool, **options: Any) -> None:
    """Run the relay until SIGTERM/SIGINT."""
    try:
        from outboxkit.relay.runner import Relay
    except ImportError as exc:
        raise click.ClickException(
            f"the relay needs a Kafka client ({exc.name} is not installed):"
            " pip install 'outboxkit[confluent]' (or 'outboxkit[aiokafka]')"
        ) from exc

    if shards:
        options["owned_shards"] = tuple(int(s) for s in shards.split(","))
    config = _config(obj, **options)
    if not config.kafka_bootstrap:
        raise click.ClickException(
            "Kafka bootstrap servers are required (OUTBOXKIT_KAFKA_BOOTSTRAP)"
        )
    _setup_logging(json_logs)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await Relay(config, stop=stop).run()

    asyncio.run(main())


def _control(obj: dict[str, Any], paused: bool, reason: str | None) -> None:
    config = _config(obj)
    with psycopg.connect(config.database_url.get_secret_value(), autocommit=True) as conn:
        conn.execute(
            query("relay", "control_set", config.schema_name),
            {
                "group": config.relay_group,
                "paused": paused,
                "reason": reason,
                "changed_by": f"{getpass.getuser()}@{socket.gethostname()}",
            },
        )
    click.echo(f"relay group {config.relay_group!r} {'paused' if paused else 'resumed'}")


@relay.command()
@click.option("--reason")
@click.pass_obj
def pause(obj: dict[str, Any], reason: str | None) -> None:
    """Every relay of the group stops publishing within one poll interval."""
    _control(obj, True, reason)


@relay.command()
@click.pass_obj
def resume(obj: dict[str, Any]) -> None:
    """Undo ``pause``."""
    _control(obj, False, None)


@relay.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
def status(obj: dict[str, Any], as_json: bool) -> None:
    """Each shard's holder, token, lease expiry, backlog and oldest pending age."""
    config = _config(obj)
    with psycopg.connect(config.database_url.get_secret_value(), autocommit=True) as conn:
        paused = conn.execute(
            query("relay", "control_paused", config.schema_name), {"group": config.relay_group}
        ).fetchone()
        rows = conn.execute(
            query("relay", "status", config.schema_name), {"group": config.relay_group}
        ).fetchall()
    shards = [
        {
            "shard": r[0],
            "holder": r[1] if r[4] else None,
            "token": r[2],
            "lease_expires_at": r[3].isoformat() if r[3] else None,
            "active": bool(r[4]),
            "backlog": int(r[5]),
            "oldest_pending_seconds": round(float(r[6]), 3) if r[6] is not None else None,
            "parked": int(r[7]),
        }
        for r in rows
    ]
    if as_json:
        body = {"group": config.relay_group, "paused": bool(paused and paused[0]), "shards": shards}
        click.echo(json.dumps(body))
        return
    click.echo(f"group {config.relay_group}  paused={bool(paused and paused[0])}")
    click.echo(f"{'shard':>5} {'holder':<40} {'token':>7} {'backlog':>8} {'oldest_s':>9} parked")
    for s in shards:
        click.echo(
            f"{s['shard']:>5} {s['holder'] or '-':<40} {s['token'] or '-':>7} {s['backlog']:>8} "
            f"{s['oldest_pending_seconds'] if s['oldest_pending_seconds'] is not None else '-':>9}"
            f" {s['parked']}"
        )
