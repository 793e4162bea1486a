"""A role without its grants is told so at start-up, in one line, and not as an invalid URL:
against a real server, whose refusal is a ``ProgrammingError`` with a SQLSTATE."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from outboxkit.errors import ConfigurationError
from outboxkit.inbox.startup import wait_until_ready
from outboxkit.relay.runner import Relay
from outboxkit.settings import Settings, load_settings

pytestmark = pytest.mark.integration


@pytest.fixture
def ungranted(outboxkit_db_url: str) -> Iterator[tuple[str, str]]:
    """The URL of a LOGIN role with no grant on the outboxkit schema, and its password."""
    name = f"ok_nogrant_{uuid.uuid4().hex[:8]}"
    password = f"pw-{uuid.uuid4().hex}"
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    parts = urlsplit(outboxkit_db_url)
    host = parts.netloc.rpartition("@")[2]
    try:
        yield urlunsplit(parts._replace(netloc=f"{name}:{password}@{host}")), password
    finally:
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {name}")


def _settings(url: str, bootstrap: str) -> Settings:
    return load_settings(overrides={"database": {"url": url}, "kafka": {"bootstrap": bootstrap}})


def _check(message: str, password: str) -> None:
    assert "the database URL is invalid" not in message
    assert "permission denied" in message
    assert "42501" in message
    assert password not in message
    assert "\n" not in message


async def test_the_relay_says_permission_denied(
    ungranted: tuple[str, str], outboxkit_kafka_bootstrap: str
) -> None:
    url, password = ungranted
    with pytest.raises(ConfigurationError) as raised:
        await Relay(_settings(url, outboxkit_kafka_bootstrap)).run()
    _check(str(raised.value), password)


def test_the_consumer_says_permission_denied(
    ungranted: tuple[str, str], outboxkit_kafka_bootstrap: str
) -> None:
    url, password = ungranted

    async def kafka_ok() -> None:
        return None

    with pytest.raises(ConfigurationError) as raised:
        wait_until_ready(_settings(url, outboxkit_kafka_bootstrap), kafka_ok, threading.Event())
    _check(str(raised.value), password)
