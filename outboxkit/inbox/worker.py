"""One inbox consumer as a process: what ``outboxkit inbox run`` starts.

Settings come from :class:`~outboxkit.settings.ConsumerSettings` (``OUTBOXKIT_CONSUMER_*``),
:class:`~outboxkit.settings.KafkaSettings` (``OUTBOXKIT_KAFKA_*``: the client, connection and
security) and :class:`~outboxkit.settings.DatabaseSettings` (``OUTBOXKIT_DATABASE_URL``). The
Kafka client picks the driver: confluent-kafka runs the sync :class:`Inbox`, aiokafka the
:class:`AsyncInbox` (so with only one extra installed, that one is used). SIGTERM/SIGINT stop
the loop after the current delivery. ``python -m outboxkit.inbox.worker`` is an alias.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import random
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from outboxkit import db
from outboxkit.db.engines import async_engine, sync_engine
from outboxkit.errors import (
    ConfigurationError,
    PermanentPublishError,
    PublishError,
)
from outboxkit.inbox.delivery import InboxSettings
from outboxkit.inbox.policy import RetryPolicy
from outboxkit.inbox.registry import EventRegistry
from outboxkit.inbox.retention import Retention
from outboxkit.kafka import KafkaClients, resolve_client
from outboxkit.schema import DEFAULT_SCHEMA
from outboxkit.settings import (
    ConsumerSettings,
    KafkaClient,
    KafkaSettings,
    Settings,
    load_settings,
)

if TYPE_CHECKING:
    from outboxkit.inbox.middleware import AsyncInbox

logger = logging.getLogger("outboxkit.inbox.worker")


def load_object(spec: str) -> Any:
    """``package.module:attribute`` to the object. The module path must be absolute and made of
    names: ``importlib`` ends a relative one (``.x``) in a ``TypeError``, not an import error."""
    module_name, _, attribute = spec.partition(":")
    names = module_name.split(".")
    if not attribute or not all(name.isidentifier() for name in names):
        raise ConfigurationError(
            f"{spec!r} is not of the form module:attribute (an absolute module path, such as"
            " package.module:registry)"
        )
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load {spec!r}: {exc}") from exc


def inbox_settings(consumer: ConsumerSettings, schema: str = DEFAULT_SCHEMA) -> InboxSettings:
    missing = consumer.missing()
    if missing:
        raise ConfigurationError(f"the consumer needs {', '.join(missing)}")
    registry = load_object(consumer.registry) if consumer.registry else EventRegistry()
    if not isinstance(registry, EventRegistry):
        raise ConfigurationError(f"{consumer.registry!r} is not an EventRegistry")
    assert consumer.name is not None
    return InboxSettings(
        consumer=consumer.name,
        registry=registry,
        policy=RetryPolicy(
            max_attempts=consumer.max_attempts,
            initial_delay=consumer.retry_delay,
            # the first back-off as asked even when it is above the default cap of 30 s
            max_delay=max(RetryPolicy.max_delay, consumer.retry_delay),
        ),
        schema=schema,
        lease_seconds=consumer.lease_seconds,
        replay_window=consumer.dedup_window,
        error_detail=consumer.error_detail,
    )


def retention(consumer: ConsumerSettings) -> Retention | None:
    """The purge timer of ``outboxkit inbox run`` (``retention_window`` 0 turns it off). A
    window shorter than the dedup window is raised to it by the loop's purger, which sees it as
    ``InboxSettings.replay_window`` (:func:`inbox_settings`)."""
    window = consumer.retention_window
    if not window:
        return None
    if consumer.dedup_window is None:
        # Purged rows are forgotten: said at start-up, without asking Kafka (reading a topic's
        # retention needs DescribeConfigs and, with Kafka away, would hold up the start).
        logger.warning(
            "inbox rows are purged %.0f s after they finish and no dedup window is set: a replay"
            " of an older event (an offset reset, a topic kept longer) would be applied again;"
            " set OUTBOXKIT_CONSUMER_DEDUP_WINDOW (checked against the topics' retention.ms at"
            " start-up) to refuse such replays",
            window,
        )
    return Retention(window, every_seconds=consumer.retention_interval)


def _metrics(consumer: ConsumerSettings) -> Any:
    if consumer.metrics_port is None:
        return None
    from outboxkit.http_endpoint import scrape, serve
    from outboxkit.inbox.metrics import InboxMetrics

    metrics = InboxMetrics()
    route, host, port = scrape(metrics.registry), consumer.metrics_host, consumer.metrics_port
    # "/" too: prometheus_client's own server, used before, answered every path.
    serve({"/metrics": route, "/": route}, host, port, "consumer")
    return metrics


async def _check_window(kafka: KafkaSettings, consumer: ConsumerSettings) -> None:
    if consumer.dedup_window is None:
        return
    from outboxkit.inbox.retention import check_window

    admin = KafkaClients(kafka).admin()
    try:
        await check_window(admin, consumer.topics, consumer.dedup_window)
    finally:
        await admin.close()


def run(config: Settings | None = None) -> None:
    """Consume until SIGTERM/SIGINT (settings default to :func:`load_settings`: the TOML file
    named by ``OUTBOXKIT_CONFIG``, ``OUTBOXKIT_*`` variables and secret files)."""
    config = config if config is not None else load_settings()
    consumer, kafka = config.consumer, config.kafka
    settings = inbox_settings(consumer, config.schema_name)
    handler = load_object(consumer.handler) if consumer.handler else None
    url = config.database_url
    db.sqlalchemy_url(url)  # a URL SQLAlchemy cannot take fails before anything starts
    options: dict[str, Any] = {
        "group_id": consumer.group,
        "topics": consumer.topics,
        "config": consumer.client_options(),
        "dead_letter": consumer.dead_letter or None,
        "acks_topic": consumer.acks_topic,
        "offset_commit_interval": consumer.offset_commit_interval,
        "metrics": _metrics(consumer),
        "dead_letter_check": consumer.dead_letter_check,
        "retention": retention(consumer),
        "max_unexpected_errors": consumer.max_unexpected_errors,
        "batch_max_records": consumer.batch_max_records,
        "batch_max_ms": consumer.batch_max_ms,
    }
    if not _started(config):
        return
    # Its sessions show as outboxkit-inbox-<consumer> in pg_stat_activity, unless the URL, a
    # service file or PGAPPNAME names them (libpq's rule for a fallback name).
    connect_args = {
        "fallback_application_name": f"outboxkit-inbox-{settings.consumer}",
        **db.connect_timeout(url),
        **config.database.connect_options(),
    }
    if resolve_client(kafka) is KafkaClient.CONFLUENT:
        _run_sync(url, handler, settings, kafka, options, connect_args)
    else:
        asyncio.run(_run_async(url, handler, settings, kafka, options, connect_args))


def _started(config: Settings) -> bool:
    """Wait for the database, and for Kafka when a dedup window is checked against the topics
    (SIGTERM/SIGINT end the wait and the process)."""
    from outboxkit.inbox.startup import wait_until_ready

    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        ready = wait_until_ready(config, lambda: _check_window(config.kafka, config.consumer), stop)
        return ready and not stop.is_set()  # a SIGTERM during a check that then passed ends it
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _starting(settings: InboxSettings, options: Any) -> None:
    """Said once a stop is handled: from here on, SIGTERM ends the process cleanly."""
    logger.info(
        "consumer %s starting: group %s, topics %s",
        settings.consumer,
        options["group_id"],
        ", ".join(options["topics"]),
    )


def _run_sync(
    url: db.Url,
    handler: Any,
    settings: InboxSettings,
    kafka: KafkaSettings,
    options: Any,
    connect_args: dict[str, Any],
) -> None:
    from outboxkit.inbox.confluent import ConfluentInboxConsumer
    from outboxkit.inbox.middleware import Inbox

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    _starting(settings, options)
    connections = db.OpenConnections()
    engine = sync_engine(url, connect_args=connect_args, track=connections)
    inbox = Inbox(engine, handler, settings) if handler else Inbox(engine, settings)
    # A stop the database does not answer still ends, the close included (outboxkit.db.abandon).
    with db.StopWatchdog(connections, stop.is_set, db.answers(url, **connect_args)):
        try:
            with ConfluentInboxConsumer(inbox, kafka, stop=stop, **options) as running:
                running.run(stop)
        finally:
            stop.set()
            engine.dispose()


async def _run_async(
    url: db.Url,
    handler: Any,
    settings: InboxSettings,
    kafka: KafkaSettings,
    options: Any,
    connect_args: dict[str, Any],
) -> None:
    from outboxkit.inbox.middleware import AsyncInbox

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    _starting(settings, options)
    connections = db.OpenConnections()
    engine = async_engine(url, connect_args=connect_args, track=connections)
    inbox = AsyncInbox(engine, handler, settings) if handler else AsyncInbox(engine, settings)
    # A stop the database does not answer still ends, the close included (outboxkit.db.abandon).
    with db.StopWatchdog(connections, stop.is_set, db.answers(url, **connect_args)):
        try:
            await _consume_async(inbox, kafka, options, stop)
        finally:
            stop.set()
            await engine.dispose()


async def _consume_async(
    inbox: AsyncInbox, kafka: KafkaSettings, options: Any, stop: asyncio.Event
) -> None:
    """Run the aiokafka consumer until ``stop``, starting it again while Kafka is away."""
    from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer
    from outboxkit.inbox.startup import BACKOFF_INITIAL, BACKOFF_MAX
    from outboxkit.relay.waiting import backoff_delay, finished_unless

    rng, attempt = random.Random(), 0
    while not stop.is_set():
        try:
            consumer = AiokafkaInboxConsumer(inbox, kafka, stop=stop, **options)
            # A Kafka that never answers (packets dropped) holds a start for its request
            # timeout, or for ever while the group has no coordinator: a stop ends it.
            if not await finished_unless(asyncio.ensure_future(consumer.start()), stop):
                await consumer.close()  # again if the start's own failure path did: a no-op
                return
            try:
                await consumer.run(stop)
            finally:
                await consumer.close()
            return
        except PublishError as exc:
            if isinstance(exc, PermanentPublishError):
                raise
            # Kafka away, a login or an ACL refused at the start (confluent-kafka's librdkafka
            # waits on its own): ending the process would crash-loop it under a supervisor.
            attempt += 1
            delay = backoff_delay(attempt, BACKOFF_INITIAL, BACKOFF_MAX, rng)
            logger.warning("%s; retrying in %.1fs", exc, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)


if __name__ == "__main__":  # the alias of ``outboxkit inbox run``
    from outboxkit.cli import main

    main(["inbox", "run", *sys.argv[1:]])
