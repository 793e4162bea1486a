"""Every confluent-kafka client the product creates (the relay's producer, the admin client,
the checkpoint reader, the dead-letter sender) turns librdkafka's refusal of the shared Kafka
properties into a :class:`ConfigurationError` naming the property, never its value
(librdkafka quotes some values: "Unsupported SASL mechanism: <value>")."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from outboxkit.errors import ConfigurationError
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit

SECRET = "hunter2-secret"
UNREACHABLE = "127.0.0.1:1"  # nothing is ever sent: the configuration fails first


def _producer(settings: KafkaSettings) -> None:
    from outboxkit.kafka.confluent_producer import ConfluentTransactionalProducer

    producer = ConfluentTransactionalProducer(settings, transactional_id=None)
    asyncio.run(producer.start())


def _admin(settings: KafkaSettings) -> None:
    from outboxkit.kafka.confluent_admin import ConfluentAdmin

    ConfluentAdmin(settings)


def _sender(settings: KafkaSettings) -> None:
    from outboxkit.kafka.confluent_sender import ConfluentRecordSender

    ConfluentRecordSender(settings).send("t", None, b"v", [])


def _checkpoint_reader(settings: KafkaSettings) -> None:
    from outboxkit.kafka.confluent_checkpoint import ConfluentCheckpointReader

    asyncio.run(ConfluentCheckpointReader(settings).last_committed("t", 0, b"k"))


@pytest.mark.parametrize("build", [_producer, _admin, _sender, _checkpoint_reader])
@pytest.mark.parametrize(
    ("properties", "named", "problem"),
    [
        (
            {"sasl.oauthbearer.method": SECRET},
            "sasl.oauthbearer.method",
            "not accepted",
        ),
        ({"no.such.property": SECRET}, "no.such.property", "unknown property"),
    ],
)
def test_a_refused_kafka_property_is_a_configuration_error_without_its_value(
    build: Callable[[KafkaSettings], None],
    properties: dict[str, str],
    named: str,
    problem: str,
) -> None:
    pytest.importorskip("confluent_kafka")
    settings = KafkaSettings(bootstrap=UNREACHABLE, properties=properties)
    with pytest.raises(ConfigurationError) as caught:
        build(settings)
    message = str(caught.value)
    assert repr(named) in message, message
    assert problem in message, message
    assert "OUTBOXKIT_KAFKA_" in message
    assert SECRET not in message


def test_aiokafka_names_the_librdkafka_properties_it_does_not_read_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A setting silently ignored would be a trap: aiokafka says which ones, never their value."""
    from outboxkit.kafka import config
    from outboxkit.kafka.config import aiokafka_options

    monkeypatch.setattr(config, "_unread_warned", set())  # as in a fresh process
    settings = KafkaSettings(
        bootstrap=UNREACHABLE,
        properties={"message.max.bytes": "5000000", "sasl.oauthbearer.config": SECRET},
    )
    with caplog.at_level("WARNING", logger="outboxkit.kafka"):
        options = aiokafka_options(settings)
        aiokafka_options(settings)  # the same set again: not repeated
    warnings = [r.getMessage() for r in caplog.records if r.name == "outboxkit.kafka"]
    assert len(warnings) == 1, warnings
    assert "message.max.bytes, sasl.oauthbearer.config" in warnings[0]
    assert "an aiokafka client, which does not read them" in warnings[0]
    assert SECRET not in warnings[0]
    assert SECRET not in repr(options)
    caplog.clear()
    with caplog.at_level("WARNING", logger="outboxkit.kafka"):
        aiokafka_options(KafkaSettings(bootstrap=UNREACHABLE))
    assert not caplog.records
