"""Settings that would be ignored, misread or waited on for ever are refused at load time, in
one line naming the setting and never its value; unreadable files likewise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError as PydanticValidationError

from outboxkit.cli import main
from outboxkit.errors import ConfigurationError
from outboxkit.kafka.config import aiokafka_options, confluent_config
from outboxkit.settings import KafkaSettings, SecurityProtocol, Settings, load_settings

SECRET = "hunter2-LEAK"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets: no OUTBOXKIT_* from the surrounding environment."""
    for name in list(os.environ):
        if name.startswith("OUTBOXKIT_"):
            monkeypatch.delenv(name)


def _refused(monkeypatch: pytest.MonkeyPatch, **env: str) -> str:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    message = str(raised.value)
    assert "\n" not in message
    assert SECRET not in message
    return message


# ------------------------------------------------------------------------------ unreadable files


def test_a_config_file_that_is_not_utf8_is_named_not_quoted(tmp_path: Path) -> None:
    path = tmp_path / "outboxkit.toml"
    path.write_bytes(b'[kafka]\nsasl_password = "hunter2-LEAK\xff"\n')
    with pytest.raises(ConfigurationError) as raised:
        load_settings(path)
    assert str(raised.value) == f"cannot read configuration file {path}: it is not valid UTF-8"
    result = CliRunner(env={"OUTBOXKIT_CONFIG": str(path)}).invoke(main, ["config", "show"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert str(path) in result.output


def test_a_secret_file_that_is_not_utf8_is_named_not_quoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "OUTBOXKIT_KAFKA_SASL_PASSWORD").write_bytes(b"hunter2-LEAK\xfe\xff")
    message = _refused(monkeypatch, OUTBOXKIT_SECRETS_DIR=str(tmp_path))
    assert "OUTBOXKIT_KAFKA_SASL_PASSWORD" in message
    assert "not valid UTF-8" in message


def test_a_secret_file_is_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """Read in a process whose locale encoding is ASCII (C locale, neither UTF-8 mode nor locale
    coercion): a read in the locale's encoding would fail on the first non-ASCII byte."""
    (tmp_path / "OUTBOXKIT_RELAY_GROUP").write_bytes("grün\n".encode())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOXKIT_", "LC_", "LANG"))}
    env.update(
        OUTBOXKIT_SECRETS_DIR=str(tmp_path), LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0"
    )
    script = (
        "import locale; from outboxkit.settings import load_settings;"
        " print(locale.getpreferredencoding(False), ascii(load_settings().relay.group))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ANSI_X3.4-1968", ascii("grün")]


# --------------------------------------------------------------------------- Kafka security fit


@pytest.mark.parametrize(
    ("env", "named"),
    [
        (
            {"OUTBOXKIT_KAFKA_SASL_USERNAME": "app", "OUTBOXKIT_KAFKA_SASL_PASSWORD": SECRET},
            ["OUTBOXKIT_KAFKA_SASL_USERNAME", "OUTBOXKIT_KAFKA_SASL_PASSWORD", "no SASL"],
        ),
        (
            {"OUTBOXKIT_KAFKA_SECURITY_PROTOCOL": "SSL", "OUTBOXKIT_KAFKA_SASL_MECHANISM": "PLAIN"},
            ["OUTBOXKIT_KAFKA_SASL_MECHANISM", "security protocol SSL uses no SASL"],
        ),
        (
            {"OUTBOXKIT_KAFKA_SSL_CA_LOCATION": "/etc/ca.pem"},
            ["OUTBOXKIT_KAFKA_SSL_CA_LOCATION", "security protocol PLAINTEXT uses no SSL"],
        ),
        (
            {
                "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "OUTBOXKIT_KAFKA_SASL_MECHANISM": "PLAIN",
                "OUTBOXKIT_KAFKA_SASL_USERNAME": "app",
                "OUTBOXKIT_KAFKA_SASL_PASSWORD": "pw",
                "OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD": SECRET,
            },
            ["OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD", "SASL_PLAINTEXT uses no SSL"],
        ),
        (
            {
                "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL": "SSL",
                "OUTBOXKIT_KAFKA_SSL_KEY_LOCATION": "/etc/client.key",
                "OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD": SECRET,
            },
            ["OUTBOXKIT_KAFKA_SSL_KEY_LOCATION", "without OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOC"],
        ),
        (
            {"OUTBOXKIT_KAFKA_SECURITY_PROTOCOL": "SSL", "OUTBOXKIT_KAFKA_SSL_CA_LOCATION": ""},
            ["OUTBOXKIT_KAFKA_SSL_CA_LOCATION", "must not be empty"],
        ),
        (
            {
                "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "OUTBOXKIT_KAFKA_SASL_MECHANISM": "PLAIN",
                "OUTBOXKIT_KAFKA_SASL_USERNAME": "",
                "OUTBOXKIT_KAFKA_SASL_PASSWORD": "",
            },
            ["OUTBOXKIT_KAFKA_SASL_USERNAME", "OUTBOXKIT_KAFKA_SASL_PASSWORD", "must not be empty"],
        ),
    ],
    ids=[
        "sasl_on_plaintext",
        "sasl_on_ssl",
        "ssl_on_plaintext",
        "ssl_on_sasl_plaintext",
        "key_without_certificate",
        "empty_ca_path",
        "empty_sasl_credentials",
    ],
)
def test_kafka_security_settings_that_would_be_ignored_are_refused(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: list[str]
) -> None:
    message = _refused(monkeypatch, **env)
    for text in named:
        assert text in message


def test_a_complete_secured_configuration_still_loads_for_both_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        "OUTBOXKIT_KAFKA_BOOTSTRAP": "kafka.example:9093",
        "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "OUTBOXKIT_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "OUTBOXKIT_KAFKA_SASL_USERNAME": "app",
        "OUTBOXKIT_KAFKA_SASL_PASSWORD": SECRET,
    }.items():
        monkeypatch.setenv(name, value)
    kafka = load_settings().kafka
    assert confluent_config(kafka)["sasl.password"] == SECRET
    assert aiokafka_options(kafka)["sasl_plain_password"] == SECRET


# ---------------------------------------------------------------------------- [kafka] properties


@pytest.mark.parametrize(
    "text",
    [
        '[kafka]\nproperties = { "linger.ms" = { "value" = 5 } }\n',
        '[kafka]\nproperties = { "linger.ms" = [5] }\n',
    ],
)
def test_a_property_value_that_is_not_a_scalar_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "outboxkit.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError) as raised:
        load_settings(path)
    assert "[kafka] properties" in str(raised.value)
    assert "'linger.ms': values must be strings, numbers or booleans" in str(raised.value)


def test_a_null_property_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    message = _refused(
        monkeypatch, OUTBOXKIT_KAFKA_PROPERTIES='{"sasl.oauthbearer.config": null, "a": "1"}'
    )
    assert "'sasl.oauthbearer.config': values must be strings" in message


def test_scalar_property_values_still_become_librdkafka_text(tmp_path: Path) -> None:
    path = tmp_path / "outboxkit.toml"
    path.write_text('[kafka]\nproperties = { "a" = true, "b" = 5, "c" = 0.5, "d" = "x" }\n')
    properties = load_settings(path).kafka.properties
    assert {k: v.get_secret_value() for k, v in properties.items()} == {
        "a": "true",
        "b": "5",
        "c": "0.5",
        "d": "x",
    }


# ------------------------------------------------------------------------------ relay settings


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OUTBOXKIT_RELAY_KAFKA_TIMEOUT", "0.0004"),  # 0 ms: librdkafka's "no timeout"
        ("OUTBOXKIT_RELAY_KAFKA_TIMEOUT", "0.5"),
        ("OUTBOXKIT_RELAY_LEASE_TTL", "0.001"),
        ("OUTBOXKIT_RELAY_POLL_INTERVAL", "0.000001"),
    ],
)
def test_too_small_relay_times_are_refused(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    message = _refused(monkeypatch, **{name: value})
    assert name in message
    assert "greater than or equal to" in message


def test_the_smallest_times_in_use_still_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The short leases and waits of the fault tests, the demo and the verify runner."""
    for name, value in {
        "OUTBOXKIT_RELAY_KAFKA_TIMEOUT": "1",
        "OUTBOXKIT_RELAY_LEASE_TTL": "1",
        "OUTBOXKIT_RELAY_POLL_INTERVAL": "0.01",
    }.items():
        monkeypatch.setenv(name, value)
    relay = load_settings().relay
    assert (relay.kafka_timeout, relay.lease_ttl, relay.poll_interval) == (1, 1, 0.01)


@pytest.mark.parametrize("topic", ["bad topic!", ".", "..", "x" * 250, "caf\u00e9", "a/b"])
def test_a_checkpoint_topic_kafka_refuses_is_refused(
    monkeypatch: pytest.MonkeyPatch, topic: str
) -> None:
    message = _refused(monkeypatch, OUTBOXKIT_RELAY_CHECKPOINT_TOPIC=topic)
    assert "OUTBOXKIT_RELAY_CHECKPOINT_TOPIC ([relay] checkpoint_topic)" in message
    assert "is not a Kafka topic name" in message
    assert len(topic) < 3 or topic not in message


def test_a_legal_checkpoint_topic_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOXKIT_RELAY_CHECKPOINT_TOPIC", "Team_A.relay-checkpoints." + "x" * 200)
    assert load_settings().relay.checkpoint_topic.startswith("Team_A.relay-checkpoints.")


def test_plaintext_settings_ignore_security_variables_that_would_be_refused_beside_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test kit's topic factory and the dev stack's readiness check talk to the plaintext
    listener while a secured stack's variables may be exported: those must not refuse them."""
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SASL_USERNAME", "u")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SASL_PASSWORD", "p")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SSL_CA_LOCATION", "/tmp/ca.pem")
    plain = KafkaSettings.plaintext("127.0.0.1:9092")
    assert plain.security_protocol is SecurityProtocol.PLAINTEXT
    assert (plain.sasl_username, plain.sasl_password, plain.ssl_ca_location) == (None, None, None)


@pytest.mark.parametrize("build", ["section", "whole"])
def test_a_refused_setting_never_quotes_a_secret_even_built_directly(
    monkeypatch: pytest.MonkeyPatch, build: str
) -> None:
    """``load_settings`` names settings without values; a section or the whole model built
    directly (``InboxConsumer`` without ``kafka=`` builds ``KafkaSettings()``) used pydantic's
    own text, which quotes every input, a password included."""
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SASL_PASSWORD", "hunter2-secret")
    monkeypatch.setenv("OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD", "key-secret")
    with pytest.raises(PydanticValidationError, match="SASL") as caught:
        KafkaSettings() if build == "section" else Settings()
    assert "hunter2" not in str(caught.value)
    assert "key-secret" not in str(caught.value)


@pytest.mark.usefixtures("clean_env")
def test_a_protocol_or_certificate_given_as_a_property_does_not_excuse_the_settings() -> None:
    """The client builders pass SASL and TLS settings on by ``security_protocol`` alone: with
    the protocol only in ``properties`` the credentials would be dropped without a word."""
    with pytest.raises(ConfigurationError, match="uses no SSL"):
        load_settings(
            overrides={
                "kafka": {"ssl_ca_location": "/ca.pem", "properties": {"security.protocol": "ssl"}}
            }
        )
    with pytest.raises(ConfigurationError, match="without OUTBOXKIT_KAFKA_SSL_CERTIFICATE"):
        load_settings(
            overrides={
                "kafka": {
                    "security_protocol": "SSL",
                    "ssl_key_location": "/keys/client.key",
                    "properties": {"ssl.certificate.pem": "-----BEGIN CERTIFICATE-----"},
                }
            }
        )
