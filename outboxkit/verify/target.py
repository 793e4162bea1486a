"""Which PostgreSQL and Kafka a verify run uses: the configured ones, or a self-started stack.

With both configured (``OUTBOXKIT_*`` variables or the TOML file) the run uses them and only
disturbs its own processes. Otherwise (or with ``--dev``) the dev stack starts what is missing,
and the servers it started may be restarted as faults.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from outboxkit.devstack import DevStack
from outboxkit.devstack.sasl import BOOTSTRAP_ENV
from outboxkit.devstack.stack import DATABASE_URL_ENV
from outboxkit.errors import ConfigurationError
from outboxkit.settings import KafkaSettings, load_settings
from outboxkit.verify.layout import Target

DATABASE_ENV = DATABASE_URL_ENV  # the dev stack's name for it


@contextlib.contextmanager
def open_target(dev: bool, echo: Callable[[str], None]) -> Iterator[Target]:
    settings = load_settings()
    try:
        url: str | None = settings.database_url.get_secret_value()
    except ConfigurationError:
        url = None
    if not dev and url and settings.kafka.bootstrap:
        yield Target(
            database_url=url,
            kafka=settings.kafka,
            env={DATABASE_ENV: url, BOOTSTRAP_ENV: settings.kafka.bootstrap},
        )
        return
    echo("Starting PostgreSQL and Kafka for the run (nothing configured, or --dev)...")
    stack = DevStack()
    stack.start({} if dev else None)
    try:
        for line in stack.describe():
            echo(f"  {line}")
        env = stack.env()
        kafka = (
            settings.kafka
            if stack.kafka is None
            else KafkaSettings(bootstrap=stack.kafka_bootstrap)
        )
        yield Target(
            database_url=stack.database_url,
            kafka=kafka,
            env=env,
            stack=stack,
        )
    finally:
        stack.stop()
