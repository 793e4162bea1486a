"""A consumer built in code without Kafka settings reads them from every source the processes
read: TLS or SASL kept in the secrets directory or the TOML file must not be dropped (the client
was built in plaintext, without an error, from the ``OUTBOXKIT_KAFKA_*`` variables alone)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine

from outboxkit.errors import ConfigurationError
from outboxkit.inbox import EventRegistry, Inbox, InboxSettings

pytestmark = pytest.mark.unit

REGISTRY = EventRegistry()


class _Built(Exception):
    """Raised by the stand-in for the client factory, carrying the configuration it got."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__("built")
        self.conf = conf


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OUTBOXKIT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OUTBOXKIT_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_CLIENT", "confluent")


@pytest.fixture
def inbox() -> Iterator[Inbox]:
    engine = create_engine("postgresql+psycopg://u@127.0.0.1:1/db")  # never connected
    inbox = Inbox(engine, lambda e, c, s: None, InboxSettings(consumer="c", registry=REGISTRY))
    try:
        yield inbox
    finally:
        inbox.close()
        engine.dispose()


def _client_config(inbox: Inbox, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The configuration the consumer's Kafka client is created with (it is not created)."""
    pytest.importorskip("confluent_kafka")
    from outboxkit.inbox.confluent import ConfluentInboxConsumer
    from outboxkit.kafka import confluent_consumer

    def capture(factory: Any, conf: dict[str, Any], *args: Any) -> Any:
        raise _Built(conf)

    monkeypatch.setattr(confluent_consumer, "create", capture)
    with pytest.raises(_Built) as built:
        ConfluentInboxConsumer(inbox, group_id="g", topics=["t"], dead_letter=None)
    return built.value.conf


def test_tls_from_the_secrets_directory_reaches_the_client(
    inbox: Inbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL").write_text("SSL\n")
    (tmp_path / "OUTBOXKIT_KAFKA_SSL_CA_LOCATION").write_text("/etc/kafka/ca.pem\n")
    monkeypatch.setenv("OUTBOXKIT_SECRETS_DIR", str(tmp_path))
    conf = _client_config(inbox, monkeypatch)
    assert conf["security.protocol"] == "ssl"
    assert conf["ssl.ca.location"] == "/etc/kafka/ca.pem"


def test_tls_from_the_config_file_reaches_the_client(
    inbox: Inbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "outboxkit.toml"
    path.write_text('[kafka]\nsecurity_protocol = "SSL"\nssl_check_hostname = false\n')
    monkeypatch.setenv("OUTBOXKIT_CONFIG", str(path))
    conf = _client_config(inbox, monkeypatch)
    assert conf["security.protocol"] == "ssl"
    assert conf["ssl.endpoint.identification.algorithm"] == "none"


def test_only_the_kafka_section_is_read_and_its_errors_are_typed(
    inbox: Inbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay or consumer setting the embedded consumer does not use cannot stop it; a Kafka
    setting it cannot use stops it with a :class:`ConfigurationError` naming the setting."""
    monkeypatch.setenv("OUTBOXKIT_RELAY_BATCH_SIZE", "0")
    monkeypatch.setenv("OUTBOXKIT_CONSUMER_MAX_ATTEMPTS", "0")
    assert _client_config(inbox, monkeypatch)["security.protocol"] == "plaintext"
    (tmp_path / "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL").write_text("TLS-PLEASE\n")
    monkeypatch.setenv("OUTBOXKIT_SECRETS_DIR", str(tmp_path))
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_KAFKA_SECURITY_PROTOCOL"):
        _client_config(inbox, monkeypatch)


@pytest.mark.parametrize("source", ["variables", "secret files", "config file"])
def test_the_database_and_schema_settings_are_not_read(
    source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An embedded consumer gets its engine from the application, never from ``[database]`` or
    ``OUTBOXKIT_SCHEMA``: a bad value there stopped it all the same."""
    from outboxkit.settings import load_kafka_settings

    if source == "variables":
        monkeypatch.setenv("OUTBOXKIT_SCHEMA", "Bad-Schema")
        monkeypatch.setenv("OUTBOXKIT_DATABASE_PREPARED_STATEMENTS", "maybe")
    elif source == "secret files":
        (tmp_path / "OUTBOXKIT_SCHEMA").write_bytes(b"\xff not UTF-8")
        (tmp_path / "OUTBOXKIT_DATABASE_PREPARED_STATEMENTS").write_text("maybe\n")
        monkeypatch.setenv("OUTBOXKIT_SECRETS_DIR", str(tmp_path))
    else:
        path = tmp_path / "outboxkit.toml"
        path.write_text('schema = "Bad-Schema"\n[database]\nprepared_statements = "maybe"\n')
        monkeypatch.setenv("OUTBOXKIT_CONFIG", str(path))
    assert load_kafka_settings().bootstrap == "127.0.0.1:1"
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SSL_CHECK_HOSTNAME", "maybe")
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_KAFKA_SSL_CHECK_HOSTNAME"):
        load_kafka_settings()
