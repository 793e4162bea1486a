"""A client error's name is shown once: aiokafka's errors put it in their text already."""

from __future__ import annotations

import pytest

from outboxkit.errors import detail_of, named

pytestmark = pytest.mark.unit


def test_aiokafka_errors_are_named_once() -> None:
    errors = pytest.importorskip("aiokafka.errors")
    cases = [
        (errors.KafkaTimeoutError("metadata unavailable"), "metadata unavailable"),
        (errors.KafkaTimeoutError(), ""),
        (
            errors.KafkaConnectionError("Unable to bootstrap from [x]"),
            "Unable to bootstrap from [x]",
        ),
        (errors.UnknownTopicOrPartitionError("topic 't'"), "[Error 3] topic 't'"),
        (errors.NotLeaderForPartitionError(), "[Error 6]"),
    ]
    for exc, text in cases:
        assert detail_of(exc) == text, exc
        name = type(exc).__name__
        assert named(exc) == (f"{name}: {text}" if text else name)
        assert named(exc).count(name) == 1


def test_other_errors_keep_their_text() -> None:
    assert named(TimeoutError()) == "TimeoutError"
    assert named(OSError("connection refused")) == "OSError: connection refused"
    # a text that only mentions another error's name is not cut
    assert detail_of(ValueError("KafkaTimeoutError: x")) == "KafkaTimeoutError: x"
    assert detail_of(ValueError("ValueErrors: many")) == "ValueErrors: many"
    assert detail_of(ValueError("ValueError\n")) == "ValueError\n"  # only the whole text


def test_a_consumer_records_a_kafka_error_with_its_name_once() -> None:
    """The inbox's own error text (a close that failed, a rejoin) reads aiokafka's errors too."""
    errors = pytest.importorskip("aiokafka.errors")
    from outboxkit.inbox.guard import error_text

    refused = errors.KafkaConnectionError("Unable to bootstrap from [x]")
    assert error_text(refused) == "KafkaConnectionError: Unable to bootstrap from [x]"
    assert error_text(refused, detail=True) == "KafkaConnectionError: Unable to bootstrap from [x]"
    assert error_text(ValueError("bad")) == "ValueError: bad"
