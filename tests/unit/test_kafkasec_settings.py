"""Free-form Kafka settings cannot undo the typed ones, and names handed to Kafka are checked
when the settings load.

``[kafka] properties`` and the consumer's ``kafka_options`` reach one client library only; a
property that says what a typed setting says (``security.protocol``, ``ssl.*`` paths, SASL
credentials, certificate checks) would downgrade that client alone. A property whose value must
be a Python object cannot come from text: confluent-kafka refuses it at every client creation
(a relay retried it for ever). A topic name Kafka refuses made a consumer log
UNKNOWN_TOPIC_OR_PART for ever.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from outboxkit.cli import main
from outboxkit.errors import ConfigurationError
from outboxkit.inbox import EventRegistry
from outboxkit.settings import KafkaSettings, load_settings

pytestmark = pytest.mark.unit

SECRET = "hunter2-not-shown"
UNREACHABLE = "127.0.0.1:1"  # nothing is ever sent: the configuration fails first
SASL_SSL: dict[str, Any] = {
    "bootstrap": UNREACHABLE,
    "security_protocol": "SASL_SSL",
    "sasl_mechanism": "SCRAM-SHA-512",
    "sasl_username": "relay",
    "sasl_password": SECRET,
}
# What the typed settings decide, in librdkafka's spelling (aliases included).
OWNED_PROPERTIES = [
    "bootstrap.servers",
    "metadata.broker.list",
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
]
# ... and in aiokafka's.
OWNED_OPTIONS = [
    "bootstrap_servers",
    "security_protocol",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "ssl_context",
]
REGISTRY = EventRegistry()
CALLBACKS = ["error_cb", "stats_cb", "throttle_cb", "oauth_cb", "logger", "on_commit"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets: no OUTBOXKIT_* from the surrounding environment."""
    for name in list(os.environ):
        if name.startswith("OUTBOXKIT_"):
            monkeypatch.delenv(name)


def _refused(**overrides: Any) -> str:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(overrides=overrides)
    message = str(caught.value)
    assert SECRET not in message
    return message


# ------------------------------------------------- 1. the typed security settings cannot be undone


def test_the_audited_downgrade_is_refused_when_the_settings_load() -> None:
    """SASL_SSL in the settings, plaintext without certificate checks in the properties: the
    confluent-kafka clients connected in plaintext while aiokafka's and ``config show`` said
    SASL_SSL."""
    properties = {"security.protocol": "plaintext", "enable.ssl.certificate.verification": "false"}
    message = _refused(kafka={**SASL_SSL, "properties": properties})
    assert "OUTBOXKIT_KAFKA_PROPERTIES ([kafka] properties)" in message
    assert "'enable.ssl.certificate.verification' is decided by" in message
    with pytest.raises(ValueError, match=r"'security\.protocol' is decided by"):
        KafkaSettings(**SASL_SSL, properties={"security.protocol": "plaintext"})


@pytest.mark.parametrize("name", OWNED_PROPERTIES)
def test_a_property_the_typed_settings_decide_is_refused(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOXKIT_KAFKA_PROPERTIES", f'{{"{name}": "{SECRET}"}}')
    message = _refused(kafka=SASL_SSL)
    assert f"{name!r} is decided by" in message, message


@pytest.mark.parametrize("name", OWNED_PROPERTIES + OWNED_OPTIONS)
def test_a_consumer_option_the_typed_settings_decide_is_refused(name: str) -> None:
    """In either client's spelling: the consumer section does not know which client runs."""
    message = _refused(consumer={"kafka_options": {name: SECRET}})
    assert "OUTBOXKIT_CONSUMER_KAFKA_OPTIONS" in message
    assert f"{name!r} is decided by" in message, message


def test_sasl_and_tls_extras_no_typed_setting_covers_stay_allowed() -> None:
    extras = {
        "sasl.oauthbearer.client.secret": SECRET,
        "ssl.ca.pem": "-----BEGIN CERTIFICATE-----",
        "ssl.crl.location": "/etc/kafka/crl.pem",
        "client.id": "billing",
    }
    settings = load_settings(
        overrides={
            "kafka": {**SASL_SSL, "properties": extras},
            "consumer": {"kafka_options": extras},
        }
    )
    assert set(settings.kafka.properties) == set(extras)
    assert settings.consumer.client_options() == extras


def test_the_client_builders_refuse_it_however_the_settings_were_built() -> None:
    """An embedded consumer's ``config`` never passes through the settings model, and a model
    can be changed after it was checked."""
    from outboxkit.kafka.config import aiokafka_options, confluent_config

    settings = KafkaSettings(**SASL_SSL)
    with pytest.raises(ConfigurationError, match=r"'security\.protocol' is decided by"):
        confluent_config(settings, options={"security.protocol": "plaintext"})
    with pytest.raises(ConfigurationError, match="'security_protocol' is decided by"):
        aiokafka_options(settings, options={"security_protocol": "PLAINTEXT"})
    settings.properties["ssl.endpoint.identification.algorithm"] = SecretStr("none")
    with pytest.raises(ConfigurationError, match="OUTBOXKIT_KAFKA_PROPERTIES") as caught:
        confluent_config(settings)
    assert "'ssl.endpoint.identification.algorithm'" in str(caught.value)


def test_an_embedded_consumer_cannot_downgrade_its_client() -> None:
    pytest.importorskip("confluent_kafka")
    pytest.importorskip("aiokafka")
    from outboxkit.kafka.aiokafka_consumer import AiokafkaGroupConsumer
    from outboxkit.kafka.confluent_consumer import ConfluentGroupConsumer

    settings = KafkaSettings(**SASL_SSL)
    with pytest.raises(ConfigurationError, match=r"'security\.protocol' is decided by"):
        ConfluentGroupConsumer(settings, "g", config={"security.protocol": "plaintext"}).close()
    with pytest.raises(ConfigurationError, match="'sasl_plain_password' is decided by"):
        AiokafkaGroupConsumer(settings, "g", config={"sasl_plain_password": "other"})


# ---------------------------------------------- 3. a Python-object property from text is refused


@pytest.mark.parametrize("name", CALLBACKS)
def test_a_callback_property_is_refused_when_the_settings_load(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``OUTBOXKIT_KAFKA_PROPERTIES='{"stats_cb": "x"}'`` had ``relay run`` retry a TypeError
    for ever."""
    monkeypatch.setenv("OUTBOXKIT_KAFKA_PROPERTIES", f'{{"{name}": "{SECRET}"}}')
    message = _refused()
    assert f"{name!r} takes a Python object" in message
    monkeypatch.delenv("OUTBOXKIT_KAFKA_PROPERTIES")
    message = _refused(consumer={"kafka_options": {name: SECRET}})
    assert f"{name!r} takes a Python object" in message


def test_inbox_run_refuses_a_callback_option_in_one_line() -> None:
    """``inbox run --kafka-option error_cb=x`` ended in a traceback."""
    env = {
        "OUTBOXKIT_CONSUMER_NAME": "billing",
        "OUTBOXKIT_CONSUMER_GROUP": "billing",
        "OUTBOXKIT_CONSUMER_TOPICS": "orders",
        "OUTBOXKIT_CONSUMER_REGISTRY": "tests.unit.test_kafkasec_settings:REGISTRY",
        "OUTBOXKIT_DATABASE_URL": "postgresql://u@127.0.0.1:1/db",
        "OUTBOXKIT_KAFKA_BOOTSTRAP": UNREACHABLE,
    }
    args = ["inbox", "run", "--kafka-option", f"error_cb={SECRET}"]
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 1, result.output
    assert "'error_cb' takes a Python object" in result.output
    assert "Traceback" not in result.output
    assert SECRET not in result.output
    assert not isinstance(result.exception, TypeError)


@pytest.mark.parametrize(("name", "value"), [("error_cb", "x"), ("throttle_cb", 1)])
def test_confluent_refuses_a_value_it_checks_itself_with_a_configuration_error(
    name: str, value: object
) -> None:
    """confluent-kafka's own checks raise TypeError or ValueError, not KafkaException."""
    pytest.importorskip("confluent_kafka")
    from outboxkit.kafka.confluent_consumer import ConfluentGroupConsumer

    settings = KafkaSettings(bootstrap=UNREACHABLE)
    with pytest.raises(ConfigurationError) as caught:
        ConfluentGroupConsumer(settings, "g", config={name: value}).close()
    assert f"the value of {name!r} is not accepted" in str(caught.value)


# ------------------------------------------------------------- 4. the consumer's topic names


@pytest.mark.parametrize(
    "consumer",
    [
        {"topics": ["orders", "has space"]},
        {"topics": "orders,bad/name"},
        {"topics": ["."]},
        {"topics": ["x" * 250]},
        {"acks_topic": "acks topic"},
        {"acks_topic": ".."},
        {"dead_letter": "{topic} dlq"},
        {"dead_letter": "."},
        {"dead_letter": "dlq." + "x" * 245 + "{topic}"},
    ],
)
def test_a_topic_kafka_refuses_stops_the_consumer_settings(consumer: dict[str, Any]) -> None:
    message = _refused(consumer=consumer)
    (field,) = consumer
    assert f"OUTBOXKIT_CONSUMER_{field.upper()} ([consumer] {field})" in message
    assert "not a Kafka topic name" in message


def test_topic_names_kafka_takes_are_kept() -> None:
    consumer = {
        "topics": "orders, billing.v1,a-b_c",
        "acks_topic": "acks",
        "dead_letter": "dlq-{topic}",
    }
    settings = load_settings(overrides={"consumer": consumer}).consumer
    assert settings.topics == ["orders", "billing.v1", "a-b_c"]
    assert (settings.acks_topic, settings.dead_letter) == ("acks", "dlq-{topic}")
    for dead_letter in ("{topic}.dlq", "all.dead", ""):
        kept = load_settings(overrides={"consumer": {"dead_letter": dead_letter}})
        assert kept.consumer.dead_letter == dead_letter
