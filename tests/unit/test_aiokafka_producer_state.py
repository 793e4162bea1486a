"""aiokafka guards its transaction state machine with ``assert``; after a fatal error (seen during
a broker restart in a fault-injection run) a transaction call raises ``AssertionError``. The
producer must report it as a failed publish (the shard replaces its producer), not crash the
relay. A stand-in for the client object is enough: no broker is involved in this decision."""

from __future__ import annotations

from typing import Any

import pytest

from outboxkit.errors import PublishError
from outboxkit.kafka.aiokafka_producer import AiokafkaTransactionalProducer
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit


class _FatalClient:
    async def _invalid(self) -> None:
        raise AssertionError("Invalid state transition TransactionState.FATAL_ERROR -> ABORTING")

    begin_transaction = commit_transaction = abort_transaction = _invalid


@pytest.mark.parametrize("call", ["begin", "commit", "abort"])
async def test_a_producer_in_a_fatal_state_fails_the_publish_instead_of_crashing(
    call: str,
) -> None:
    producer = AiokafkaTransactionalProducer(
        KafkaSettings(bootstrap="127.0.0.1:9", security_protocol="PLAINTEXT"),
        transactional_id="outboxkit-test-0",
    )
    client: Any = _FatalClient()
    producer._producer = client
    with pytest.raises(PublishError, match="unusable state") as caught:
        await getattr(producer, call)()
    assert not isinstance(caught.value, AssertionError)
