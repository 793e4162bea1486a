"""A client error's name is shown once: aiokafka's errors put it in their text already."""

from __future__ import annotations

import pytest

from outboxkit.kafka.errors import error_text, named

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
        assert error_text(exc) == text, exc
        name = type(exc).__name__
        assert named(exc) == (f"{name}: {text}" if text else name)
        assert named(exc).count(name) == 1


def test_other_errors_keep_their_text() -> None:
    assert named(TimeoutError()) == "TimeoutError"
    assert named(OSError("connection refused")) == "OSError: connection refused"
    # a text that only mentions another error's name is not cut
    assert error_text(ValueError("KafkaTimeoutError: x")) == "KafkaTimeoutError: x"
    assert error_text(ValueError("ValueErrors: many")) == "ValueErrors: many"
