"""A broker whose ``transaction.max.timeout.ms`` is below the relay's transaction timeout refuses
every producer start; aiokafka says only ``InvalidTransactionTimeout: [Error 50]``, so the
relay's retried error names both settings (librdkafka's own text already names the broker's)."""

from __future__ import annotations

import pytest
from aiokafka.errors import InvalidTransactionTimeout

from outboxkit.errors import PublishError
from outboxkit.kafka.aiokafka_producer import raise_for
from outboxkit.kafka.errors import TRANSACTION_TIMEOUT_HINT, with_transaction_timeout_hint

pytestmark = pytest.mark.unit


def test_the_aiokafka_refusal_names_the_settings() -> None:
    with pytest.raises(PublishError) as raised:
        raise_for(InvalidTransactionTimeout(), "producer start failed")
    assert str(raised.value) == (
        f"producer start failed: InvalidTransactionTimeout: [Error 50] ({TRANSACTION_TIMEOUT_HINT})"
    )


def test_other_errors_and_a_second_pass_are_left_alone() -> None:
    assert with_transaction_timeout_hint("KafkaTimeoutError") == "KafkaTimeoutError"
    once = with_transaction_timeout_hint("x INVALID_TRANSACTION_TIMEOUT")
    assert with_transaction_timeout_hint(once) == once
