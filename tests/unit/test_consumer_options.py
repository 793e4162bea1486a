"""A consumer option or dead-letter template the consumer cannot use stops it when it is built,
with a :class:`ConfigurationError` naming the option, never its value; no raw client error, no
failure at the first record that needs it."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from outboxkit.errors import ConfigurationError
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit

SECRET = "hunter2"
UNREACHABLE = "127.0.0.1:1"  # nothing is ever sent: the configuration fails first


def _confluent(config: dict[str, Any]) -> None:
    pytest.importorskip("confluent_kafka")
    from outboxkit.kafka.confluent_consumer import ConfluentGroupConsumer

    consumer = ConfluentGroupConsumer(KafkaSettings(bootstrap=UNREACHABLE), "g", config=config)
    consumer.close()  # reached only if the configuration was accepted


@pytest.mark.parametrize(
    ("config", "named", "problem"),
    [
        ({"no.such.option": SECRET}, "no.such.option", "unknown property"),
        (
            {"auto.offset.reset": SECRET},
            "auto.offset.reset",
            "not accepted",
        ),  # quoted by librdkafka
        (
            {"partition.assignment.strategy": SECRET},
            "partition.assignment.strategy",
            "not accepted",
        ),
        ({"session.timeout.ms": 3_600_001}, "session.timeout.ms", "not accepted"),
    ],
)
def test_confluent_refuses_an_option_with_a_configuration_error(
    config: dict[str, Any], named: str, problem: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _confluent(config)
    message = str(caught.value)
    assert repr(named) in message
    assert problem in message
    assert "OUTBOXKIT_CONSUMER_KAFKA_OPTIONS" in message
    assert SECRET not in message
    assert "3600001" not in message


def test_aiokafka_refuses_an_option_it_does_not_take_when_built() -> None:
    pytest.importorskip("aiokafka")
    from outboxkit.kafka.aiokafka_consumer import AiokafkaGroupConsumer

    settings = KafkaSettings(bootstrap=UNREACHABLE, client="aiokafka")
    with pytest.raises(ConfigurationError) as caught:
        AiokafkaGroupConsumer(settings, "g", config={"session.timeout.ms": SECRET})
    assert "'session.timeout.ms'" in str(caught.value)
    assert SECRET not in str(caught.value)


def _aiokafka_subscribe_refused(config: dict[str, Any]) -> str:
    """The text of the ConfigurationError an aiokafka consumer built with ``config`` raises
    when it subscribes."""
    pytest.importorskip("aiokafka")
    from outboxkit.kafka.aiokafka_consumer import AiokafkaGroupConsumer

    settings = KafkaSettings(bootstrap=UNREACHABLE, client="aiokafka")
    consumer = AiokafkaGroupConsumer(settings, "g", config=config)

    async def subscribe() -> None:
        await consumer.subscribe(["t"], lambda tps: None, lambda tps: {})

    with pytest.raises(ConfigurationError) as caught:
        asyncio.run(subscribe())
    return str(caught.value)


def test_aiokafka_refuses_a_value_it_cannot_take_when_it_subscribes() -> None:
    text = _aiokafka_subscribe_refused({"max_poll_records": SECRET})
    assert SECRET not in text
    assert "OUTBOXKIT_CONSUMER_KAFKA_OPTIONS" in text


def test_aiokafka_refuses_a_value_it_takes_but_cannot_start_with(
    recwarn: pytest.WarningsRecorder,
) -> None:
    """aiokafka takes ``request_timeout_ms="..."`` when built and fails in ``start()`` with a
    ``TypeError`` (a traceback at every restart, its client left unclosed)."""
    text = _aiokafka_subscribe_refused({"request_timeout_ms": SECRET})
    assert "cannot be started: an option's value is not accepted" in text
    assert SECRET not in text
    assert not [w for w in recwarn if "Unclosed" in str(w.message)]


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{topic}.{x}", "dead-letter topic template"),
        ("{0}", "dead-letter topic template"),
        ("{topic", "dead-letter topic template"),
        ("", "empty: dead_letter=None sends no dead letters"),  # was the topic ''
    ],
)
def test_a_consumer_with_an_unusable_dead_letter_template_is_not_built(
    template: str, said: str
) -> None:
    pytest.importorskip("confluent_kafka")
    from outboxkit.inbox.confluent import ConfluentInboxConsumer

    with pytest.raises(ConfigurationError, match=said):
        ConfluentInboxConsumer(
            cast(Any, None),  # never reached: the template is checked first
            KafkaSettings(bootstrap=UNREACHABLE),
            group_id="g",
            topics=["t"],
            dead_letter=template,
        )


@pytest.mark.parametrize(
    ("config", "seconds"),
    [({}, 50.0), ({"session.timeout.ms": "6000"}, 11.0), ({"session.timeout.ms": "1e4"}, 15.0)],
)
def test_an_offset_commit_may_take_the_session_timeout_and_a_margin(
    config: dict[str, Any], seconds: float
) -> None:
    """A commit deferred while no coordinator is known fails by itself at the session timeout:
    only one not answered past it gives the client up (a coordinator's move never does)."""
    pytest.importorskip("confluent_kafka")
    from outboxkit.kafka.confluent_consumer import ConfluentGroupConsumer

    consumer = ConfluentGroupConsumer(KafkaSettings(bootstrap=UNREACHABLE), "g", config=config)
    try:
        assert consumer.commit_seconds == seconds
    finally:
        consumer.close()


def test_past_the_cap_of_given_up_clients_the_consumer_stops_and_closes_nothing_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit with no answer gives its client up at the next poll; past ABANDONED_MAX such
    clients still closing, that poll ends the consumer, and a close after it leaves the given-up
    client to its own close (a second close of one librdkafka handle could free it twice)."""
    pytest.importorskip("confluent_kafka")
    from outboxkit.errors import OutboxkitError, PublishError
    from outboxkit.kafka import confluent_consumer

    monkeypatch.setattr(confluent_consumer, "ABANDONED_MAX", 0)
    consumer = confluent_consumer.ConfluentGroupConsumer(KafkaSettings(bootstrap=UNREACHABLE), "g")
    consumer.commit_seconds = 0.0  # no coordinator: librdkafka waits for one
    consumer.subscribe(["t"], lambda tps: None, lambda tps: {})
    with pytest.raises(PublishError, match="no answer within 0 s"):
        consumer.commit({("t", 0): 1})
    closes: list[object] = []
    monkeypatch.setattr(confluent_consumer, "_close_quietly", closes.append)
    with pytest.raises(OutboxkitError, match="still open"):
        consumer.poll(0, 1)
    consumer.close()
    assert len(closes) == 1  # by the poll that gave it up; none by close()


def test_a_revocation_commit_never_answered_gives_the_client_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The revocation's commit is not waited for in the rebalance callback, and librdkafka ends
    the revocation only once it is answered: with no answer by its deadline, the next poll
    replaces the client."""
    pytest.importorskip("confluent_kafka")
    from outboxkit.kafka import confluent_consumer

    consumer = confluent_consumer.ConfluentGroupConsumer(KafkaSettings(bootstrap=UNREACHABLE), "g")
    consumer.subscribe(["t"], lambda tps: None, lambda tps: {})
    old = consumer._consumer
    consumer._revocation_deadline = 0.0  # sent long ago, never answered
    closes: list[object] = []
    monkeypatch.setattr(confluent_consumer, "_close_quietly", closes.append)
    try:
        assert consumer.poll(0, 1) == []  # no answer served by this poll's consume() either
        assert closes == []
        consumer.poll(0, 1)
        assert closes == [old]  # given up by the next poll
        assert consumer._consumer is not old
    finally:
        consumer.close()
