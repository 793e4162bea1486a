"""aiokafka asserts its own state (``assert ... "Did we not perform bootstrap?"``) in a start
that races a stopping broker: the relay's producer reports it as a producer to replace, not
as an unexpected error with a traceback (seen in a soak with graceful broker restarts)."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from outboxkit.errors import PublishError
from outboxkit.kafka.aiokafka_producer import AiokafkaTransactionalProducer
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit


async def test_an_assertion_in_start_is_a_publish_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async def start(self: Any) -> None:
        raise AssertionError("Did we not perform bootstrap?")

    monkeypatch.setattr(AIOKafkaProducer, "start", start)
    producer = AiokafkaTransactionalProducer(
        KafkaSettings.plaintext("127.0.0.1:9"), transactional_id=None, timeout=1.0
    )
    with pytest.raises(PublishError, match="producer start failed: producer in an unusable"):
        await producer.start()
    with pytest.raises(PublishError, match="not started or already closed"):
        await producer.send([])  # closed: the relay replaces it
