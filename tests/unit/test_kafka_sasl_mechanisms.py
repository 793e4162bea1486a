"""OAUTHBEARER and GSSAPI (Kerberos), which the typed SASL settings have no credentials for, are
named in ``[kafka] properties`` under a typed SASL protocol: refusing every ``sasl.mechanism``
property (the typed settings own PLAIN and SCRAM) had left no way to configure them at all.

They cannot downgrade anything: the typed protocol (and with it TLS) stays in charge, a typed
SASL setting beside them is refused, and aiokafka, which does not read the properties and would
log in with another mechanism, refuses the settings instead of connecting.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from outboxkit.errors import ConfigurationError
from outboxkit.kafka import KafkaClients
from outboxkit.kafka.config import aiokafka_options, confluent_config
from outboxkit.settings import KafkaSettings, SecurityProtocol, load_settings

pytestmark = pytest.mark.unit

SECRET = "oidc-secret-not-shown"
UNREACHABLE = "127.0.0.1:1"  # nothing is ever sent: the client is created, then closed
OAUTHBEARER = {
    "sasl.mechanism": "OAUTHBEARER",
    "sasl.oauthbearer.method": "oidc",
    "sasl.oauthbearer.client.id": "billing",
    "sasl.oauthbearer.client.secret": SECRET,
    "sasl.oauthbearer.token.endpoint.url": "https://idp.invalid/token",
}
GSSAPI = {
    "sasl.mechanism": "GSSAPI",
    "sasl.kerberos.service.name": "kafka",
    "sasl.kerberos.principal": f"billing@{SECRET}",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets: no OUTBOXKIT_* from the surrounding environment."""
    for name in list(os.environ):
        if name.startswith("OUTBOXKIT_"):
            monkeypatch.delenv(name)


def _kafka(protocol: str, properties: dict[str, str], **typed: Any) -> KafkaSettings:
    kafka = {"bootstrap": UNREACHABLE, "security_protocol": protocol, "properties": properties}
    return load_settings(overrides={"kafka": {**kafka, **typed}}).kafka


def _refused(protocol: str, properties: dict[str, str], **typed: Any) -> str:
    with pytest.raises(ConfigurationError) as caught:
        _kafka(protocol, properties, **typed)
    message = str(caught.value)
    assert "OUTBOXKIT_KAFKA_PROPERTIES ([kafka] properties)" in message
    assert SECRET not in message
    return message


def _create_and_close(settings: KafkaSettings) -> None:
    """A confluent-kafka client through the seam: librdkafka checks its configuration."""
    pytest.importorskip("confluent_kafka")
    KafkaClients(settings).group_consumer("g").close()


def test_oauthbearer_from_the_properties_reaches_the_confluent_client() -> None:
    settings = _kafka("SASL_SSL", OAUTHBEARER)
    conf = confluent_config(settings)
    assert conf["security.protocol"] == "sasl_ssl"
    assert conf["sasl.mechanism"] == "OAUTHBEARER"
    assert conf["sasl.oauthbearer.client.secret"] == SECRET
    assert conf["ssl.endpoint.identification.algorithm"] == "https"  # the typed TLS stays
    assert "sasl.username" not in conf
    assert "sasl.password" not in conf
    _create_and_close(settings)


def test_the_mechanism_is_handed_on_in_librdkafka_spelling() -> None:
    """librdkafka refuses ``oauthbearer`` ("Unsupported SASL mechanism"): a mechanism accepted
    in any case reaches it upper-case, under its one name."""
    properties = {**OAUTHBEARER, "sasl.mechanisms": " oauthbearer "}
    del properties["sasl.mechanism"]
    settings = _kafka("SASL_PLAINTEXT", properties)
    conf = confluent_config(settings)
    assert conf["sasl.mechanism"] == "OAUTHBEARER"
    assert "sasl.mechanisms" not in conf
    _create_and_close(settings)


def test_gssapi_from_the_properties_is_created_or_refused_cleanly() -> None:
    """The confluent-kafka wheels from PyPI carry no Kerberos support: librdkafka then refuses
    the client ("No provider for SASL mechanism GSSAPI: recompile librdkafka..."), which must
    say so in one line, showing no value but the mechanism's name."""
    settings = _kafka("SASL_PLAINTEXT", GSSAPI)
    conf = confluent_config(settings)
    assert (conf["security.protocol"], conf["sasl.mechanism"]) == ("sasl_plaintext", "GSSAPI")
    assert "sasl.username" not in conf
    try:
        _create_and_close(settings)
    except ConfigurationError as exc:
        message = str(exc)
        assert "this librdkafka build has no SASL mechanism GSSAPI" in message, message
        assert "libsasl2" in message
        assert SECRET not in message
        assert "recompile" not in message  # librdkafka's own text is not passed on


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL"])
@pytest.mark.parametrize("properties", [OAUTHBEARER, GSSAPI])
def test_a_mechanism_property_needs_a_typed_sasl_protocol(
    protocol: str, properties: dict[str, str]
) -> None:
    message = _refused(protocol, properties)
    assert "set OUTBOXKIT_KAFKA_SECURITY_PROTOCOL" in message, message
    assert "SASL_SSL or SASL_PLAINTEXT" in message


@pytest.mark.parametrize(
    "typed",
    [
        {"sasl_username": "billing"},
        {"sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "billing", "sasl_password": SECRET},
    ],
)
def test_a_mechanism_property_beside_typed_sasl_settings_is_refused(
    typed: dict[str, str],
) -> None:
    message = _refused("SASL_SSL", OAUTHBEARER, **typed)
    assert "OUTBOXKIT_KAFKA_SASL_USERNAME ([kafka] sasl_username)" in message, message
    assert "OAUTHBEARER" in message


@pytest.mark.parametrize(
    "properties",
    [
        {"sasl.mechanism": "PLAIN"},
        {"sasl.mechanisms": "SCRAM-SHA-512"},
        {"sasl.mechanism": SECRET},
        {"sasl.mechanism": "OAUTHBEARER", "sasl.mechanisms": "GSSAPI"},
    ],
)
def test_other_mechanisms_in_the_properties_stay_refused(properties: dict[str, str]) -> None:
    message = _refused("SASL_SSL", properties)
    assert "is decided by OUTBOXKIT_KAFKA_SASL_MECHANISM" in message, message


def test_aiokafka_refuses_a_mechanism_it_would_not_read() -> None:
    """aiokafka reads no properties: it would log in with another mechanism (or none)."""
    settings = _kafka("SASL_SSL", OAUTHBEARER)
    with pytest.raises(ConfigurationError) as caught:
        aiokafka_options(settings)
    message = str(caught.value)
    assert "SASL mechanism OAUTHBEARER" in message
    assert "only the confluent-kafka clients" in message
    assert SECRET not in message


def test_the_builders_check_the_mechanism_however_the_settings_were_built() -> None:
    """A model can be changed after it was checked: the mechanism still needs its protocol."""
    settings = _kafka("SASL_SSL", OAUTHBEARER)
    settings.security_protocol = SecurityProtocol.PLAINTEXT
    with pytest.raises(ConfigurationError, match="set OUTBOXKIT_KAFKA_SECURITY_PROTOCOL"):
        confluent_config(settings)
    without = KafkaSettings(bootstrap=UNREACHABLE, security_protocol="SASL_SSL")
    with pytest.raises(ConfigurationError, match="needs OUTBOXKIT_KAFKA_SASL_MECHANISM"):
        confluent_config(without)
