"""The dev stack's OAUTHBEARER option: asked for explicitly, on the SASL_SSL listener only, and
described to clients as a user would configure it (no typed SASL setting, the mechanism and
librdkafka's unsecured-token options in ``OUTBOXKIT_KAFKA_PROPERTIES``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from outboxkit.devstack import KafkaServer, OAuthBearerListener
from outboxkit.errors import ConfigurationError, DevStackError
from outboxkit.kafka.config import aiokafka_options, confluent_config
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit

LISTENER = OAuthBearerListener(bootstrap="127.0.0.1:9093", principal="app", ca_location="/ca.pem")


def test_oauthbearer_needs_the_sasl_ssl_listener(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="security='sasl_ssl'"):
        KafkaServer(tmp_path, oauthbearer=True)


def test_a_scram_only_broker_has_no_oauthbearer_listener(tmp_path: Path) -> None:
    with pytest.raises(DevStackError, match="oauthbearer=True"):
        _ = KafkaServer(tmp_path, security="sasl_ssl").oauthbearer


def test_the_listener_is_reached_on_the_secured_port_with_the_same_ca(tmp_path: Path) -> None:
    server = KafkaServer(tmp_path, security="sasl_ssl", oauthbearer=True)
    assert server.oauthbearer.bootstrap == server.sasl_ssl.bootstrap
    assert server.oauthbearer.ca_location == server.sasl_ssl.ca_location


def test_variables_load_as_the_settings_they_describe(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("OUTBOXKIT_")]:
        monkeypatch.delenv(name)
    env = LISTENER.env()
    assert json.loads(env["OUTBOXKIT_KAFKA_PROPERTIES"])["sasl.mechanism"] == "OAUTHBEARER"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = KafkaSettings()
    assert settings == LISTENER.kafka_settings()
    conf = confluent_config(settings)
    for name, value in LISTENER.librdkafka_config().items():
        assert str(conf[name]).upper() == value.upper(), name
    assert "sasl.username" not in conf
    with pytest.raises(ConfigurationError, match="only the confluent-kafka clients"):
        aiokafka_options(settings)
