"""Run one inbox consumer as a process: ``python -m outboxkit.inbox.worker --handler mod:fn ...``.

Used by the process-level fault tests and handy for small deployments. The database URL and
the Kafka bootstrap come from ``OUTBOXKIT_DATABASE_URL`` / ``OUTBOXKIT_KAFKA_BOOTSTRAP`` (or
the options). SIGTERM/SIGINT stop the loop after the current message.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import threading
from typing import Any

import click
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine

from outboxkit.devstack.postgres import sqlalchemy_url
from outboxkit.inbox.middleware import AsyncInbox, Inbox, InboxSettings
from outboxkit.inbox.policy import RetryPolicy
from outboxkit.inbox.registry import EventRegistry
from outboxkit.migrator import DEFAULT_SCHEMA

logger = logging.getLogger("outboxkit.inbox.worker")


def load_object(spec: str) -> Any:
    """``package.module:attribute`` to the object."""
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise click.BadParameter(f"{spec!r} is not of the form module:attribute")
    return getattr(importlib.import_module(module_name), attribute)


def _parse_config(items: tuple[str, ...]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"--config expects key=value, got {item!r}")
        config[name] = int(value) if value.isdigit() else value
    return config


@click.command()
@click.option("--handler", "handler_spec", required=True, help="module:function to call.")
@click.option("--registry", "registry_spec", required=True, help="module:EventRegistry.")
@click.option("--consumer", required=True, help="Consumer name (the dedup key's first part).")
@click.option("--group", "group_id", required=True, help="Kafka consumer group id.")
@click.option("--topic", "topics", multiple=True, required=True)
@click.option("--adapter", type=click.Choice(["confluent", "aiokafka"]), default="confluent")
@click.option("--database-url", envvar="OUTBOXKIT_DATABASE_URL", required=True)
@click.option("--bootstrap", envvar="OUTBOXKIT_KAFKA_BOOTSTRAP", required=True)
@click.option("--schema", default=DEFAULT_SCHEMA, show_default=True)
@click.option("--max-attempts", default=5, show_default=True)
@click.option("--retry-delay", default=0.5, show_default=True, help="First back-off, seconds.")
@click.option("--lease-seconds", default=30.0, show_default=True)
@click.option("--dead-letter", default="{topic}.dlq", show_default=True)
@click.option("--acks-topic", default=None, help="Publish an acknowledgement per outcome here.")
@click.option(
    "--offset-commit-interval",
    default=0.0,
    show_default=True,
    help="Seconds between offset commits (0: commit after every message).",
)
@click.option("--config", "config_items", multiple=True, help="Kafka consumer option key=value.")
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics here.")
@click.option(
    "--dedup-window",
    type=float,
    default=None,
    help="Seconds dedup rows are kept: checked against the topics' retention.ms (warns), and"
    " older replays of forgotten events are refused.",
)
@click.option("-v", "--verbose", count=True)
def main(
    handler_spec: str,
    registry_spec: str,
    consumer: str,
    group_id: str,
    topics: tuple[str, ...],
    adapter: str,
    database_url: str,
    bootstrap: str,
    schema: str,
    max_attempts: int,
    retry_delay: float,
    lease_seconds: float,
    dead_letter: str,
    acks_topic: str | None,
    offset_commit_interval: float,
    config_items: tuple[str, ...],
    dedup_window: float | None,
    metrics_port: int | None,
    verbose: int,
) -> None:
    """Consume TOPIC(s) through the dedup middleware until SIGTERM."""
    logging.basicConfig(
        level=logging.WARNING - 10 * min(verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    registry = load_object(registry_spec)
    if not isinstance(registry, EventRegistry):
        raise click.BadParameter(f"{registry_spec!r} is not an EventRegistry")
    settings = InboxSettings(
        consumer=consumer,
        registry=registry,
        policy=RetryPolicy(max_attempts=max_attempts, initial_delay=retry_delay),
        schema=schema,
        lease_seconds=lease_seconds,
        replay_window=dedup_window,
    )
    if dedup_window is not None:
        _check_window(bootstrap, list(topics), dedup_window)
    metrics = None
    if metrics_port is not None:
        from prometheus_client import start_http_server

        from outboxkit.inbox.metrics import InboxMetrics

        metrics = InboxMetrics()
        start_http_server(metrics_port, addr="127.0.0.1", registry=metrics.registry)
    options = {
        "metrics": metrics,
        "handler": load_object(handler_spec),
        "settings": settings,
        "url": sqlalchemy_url(database_url),
        "bootstrap": bootstrap,
        "group_id": group_id,
        "topics": list(topics),
        "dead_letter": dead_letter,
        "acks_topic": acks_topic,
        "offset_commit_interval": offset_commit_interval,
        "config": _parse_config(config_items),
    }
    if adapter == "confluent":
        _run_confluent(**options)
    else:
        asyncio.run(_run_aiokafka(**options))


def _check_window(bootstrap: str, topics: list[str], window: float) -> None:
    from confluent_kafka import admin as kafka_admin

    from outboxkit.inbox.retention import check_window

    client = kafka_admin.AdminClient({"bootstrap.servers": bootstrap})
    check_window(client, topics, window)


def _run_confluent(
    *,
    handler: Any,
    settings: InboxSettings,
    url: str,
    bootstrap: str,
    group_id: str,
    topics: list[str],
    dead_letter: str,
    acks_topic: str | None,
    offset_commit_interval: float,
    config: dict[str, Any],
    metrics: Any,
) -> None:
    from outboxkit.inbox.confluent import ConfluentInboxConsumer

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    engine = create_engine(url)
    try:
        consumer = ConfluentInboxConsumer(
            Inbox(engine, handler, settings),
            bootstrap_servers=bootstrap,
            group_id=group_id,
            topics=topics,
            config=config,
            dead_letter=dead_letter,
            acks_topic=acks_topic,
            offset_commit_interval=offset_commit_interval,
            metrics=metrics,
        )
        with consumer:
            consumer.run(stop)
    finally:
        engine.dispose()


async def _run_aiokafka(
    *,
    handler: Any,
    settings: InboxSettings,
    url: str,
    bootstrap: str,
    group_id: str,
    topics: list[str],
    dead_letter: str,
    acks_topic: str | None,
    offset_commit_interval: float,
    config: dict[str, Any],
    metrics: Any,
) -> None:
    from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    engine = create_async_engine(url)
    try:
        consumer = AiokafkaInboxConsumer(
            AsyncInbox(engine, handler, settings),
            bootstrap_servers=bootstrap,
            group_id=group_id,
            topics=topics,
            config=config,
            dead_letter=dead_letter,
            acks_topic=acks_topic,
            offset_commit_interval=offset_commit_interval,
            metrics=metrics,
        )
        async with consumer:
            await consumer.run(stop)
    finally:
        await engine.dispose()


if __name__ == "__main__":
    main()
