"""pytest fixtures for real PostgreSQL and Kafka, opt-in: ``pytest -p outboxkit.pytest_plugin``
or ``pytest_plugins = ["outboxkit.pytest_plugin"]`` in a conftest.py.

Fixtures that need the services never skip: if the stack cannot start, the test errors with the
reason. Set ``OUTBOXKIT_DATABASE_URL`` / ``OUTBOXKIT_KAFKA_BOOTSTRAP`` to use external services.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from outboxkit.db import connect, redact
from outboxkit.devstack import DevStack, KafkaServer
from outboxkit.devstack.aio import run_coroutine
from outboxkit.devstack.postgres import database_url_with
from outboxkit.kafka import KafkaClients
from outboxkit.settings import KafkaSettings

TopicFactory = Callable[..., str]


class MaskedUrl(str):
    """A database URL whose repr masks its password: pytest prints a failing test's arguments
    (and fixtures are arguments) by their repr, and an external server's URL holds a real one."""

    def __repr__(self) -> str:
        return repr(redact(str(self), str(self)))


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM becomes KeyboardInterrupt so session fixtures (the stack) are torn down.
    def _terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _terminate)


_started_stacks: list[str] = []


@pytest.fixture(scope="session")
def outboxkit_stack() -> Iterator[DevStack]:
    """The running dev stack (self-started unless the environment names external services)."""
    stack = DevStack().start()
    _started_stacks.append(_describe(stack))
    try:
        yield stack
    finally:
        stack.stop()


def _describe(stack: DevStack) -> str:
    parts = []
    if stack.postgres is not None:
        seconds = stack.startup_seconds.get("postgresql", 0.0)
        parts.append(
            f"PostgreSQL self-started at 127.0.0.1:{stack.postgres.port} in {seconds:.1f}s"
            f" (pid {stack.postgres.service.pid if stack.postgres.service else '?'})"
        )
    else:
        parts.append("PostgreSQL external (OUTBOXKIT_DATABASE_URL)")
    if stack.kafka is not None:
        seconds = stack.startup_seconds.get("kafka", 0.0)
        parts.append(
            f"Apache Kafka {stack.kafka.version} (KRaft) self-started at {stack.kafka.bootstrap}"
            f" in {seconds:.1f}s (pid {stack.kafka.service.pid if stack.kafka.service else '?'})"
        )
    else:
        parts.append(f"Kafka external at {stack.kafka_bootstrap} (OUTBOXKIT_KAFKA_BOOTSTRAP)")
    return "; ".join(parts)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in _started_stacks:
        terminalreporter.write_line(f"outboxkit dev stack: {line}")


@pytest.fixture(scope="session")
def outboxkit_database_url(outboxkit_stack: DevStack) -> str:
    """libpq URL of the server's maintenance database."""
    return MaskedUrl(outboxkit_stack.database_url)


@pytest.fixture(scope="session")
def outboxkit_kafka_bootstrap(outboxkit_stack: DevStack) -> str:
    return outboxkit_stack.kafka_bootstrap


@pytest.fixture(scope="session")
def outboxkit_secure_kafka() -> Iterator[KafkaServer]:
    """A second Kafka whose clients must use SASL_SSL (SCRAM-SHA-512, a CA made at start-up).

    Started only when a test asks for it, stopped at session end. ``.sasl_ssl`` gives the
    bootstrap, credentials and CA file (``.sasl_ssl.env()`` as ``OUTBOXKIT_KAFKA_*`` variables);
    ``.plaintext_bootstrap`` is an unauthenticated loopback listener for test set-up only.
    Always self-started: ``OUTBOXKIT_KAFKA_BOOTSTRAP`` does not apply to it.
    """
    from outboxkit.devstack.registry import reap_orphans

    reap_orphans()
    server = KafkaServer(security="sasl_ssl")
    started = time.monotonic()
    try:
        server.start()
        _started_stacks.append(
            f"Apache Kafka {server.version} (KRaft, SASL_SSL SCRAM-SHA-512) self-started at"
            f" {server.bootstrap} in {time.monotonic() - started:.1f}s"
        )
        yield server
    finally:
        try:
            server.stop()
        finally:
            server.destroy()


@pytest.fixture(scope="session")
def outboxkit_template_database(outboxkit_database_url: str) -> Iterator[str]:
    """A database with every outboxkit migration applied, cloned for each test."""
    name = f"outboxkit_template_{uuid.uuid4().hex[:8]}"
    with connect(outboxkit_database_url) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = database_url_with(outboxkit_database_url, name)
    from outboxkit.db.migrator import upgrade

    upgrade(url)
    try:
        yield name
    finally:
        _drop_database(outboxkit_database_url, name)


@pytest.fixture
def outboxkit_db_url(
    outboxkit_database_url: str, outboxkit_template_database: str
) -> Iterator[str]:
    """A fresh, migrated database for this test (a template clone), dropped afterwards."""
    name = f"outboxkit_test_{uuid.uuid4().hex[:12]}"
    with connect(outboxkit_database_url) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(outboxkit_template_database)
            )
        )
    try:
        yield MaskedUrl(database_url_with(outboxkit_database_url, name))
    finally:
        _drop_database(outboxkit_database_url, name)


@pytest.fixture
def outboxkit_empty_db_url(outboxkit_database_url: str) -> Iterator[str]:
    """A fresh database with nothing in it (for migration tests)."""
    name = f"outboxkit_empty_{uuid.uuid4().hex[:12]}"
    with connect(outboxkit_database_url) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield MaskedUrl(database_url_with(outboxkit_database_url, name))
    finally:
        _drop_database(outboxkit_database_url, name)


@pytest.fixture
def outboxkit_topic(outboxkit_kafka_bootstrap: str) -> TopicFactory:
    """Factory: ``outboxkit_topic(partitions=3, config={...})`` creates a uniquely named topic."""
    settings = KafkaSettings.plaintext(outboxkit_kafka_bootstrap)

    def create(prefix: str = "t", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"

        async def make() -> None:
            admin = KafkaClients(settings, timeout=60.0).admin()
            try:
                await admin.create_topic(name, partitions, config or {}, replication_factor=1)
            finally:
                await admin.close()

        run_coroutine(make())
        return name

    return create


def _drop_database(server_url: str, name: str) -> None:
    try:
        with connect(server_url) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    except psycopg.OperationalError:
        pass  # the server was stopped by a fault test; the cluster is thrown away anyway
