"""A join refused for want of a shared assignment strategy: the typed error, whichever client
and whenever it comes (the real-broker refusals at the join: tests/integration/
test_inbox_mixed_clients.py). aiokafka also refuses a rejoin of a running member that way,
raised out of its ``getmany``: that path is scripted here."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from outboxkit.errors import ConfigurationError, GroupProtocolError, PermanentPublishError
from outboxkit.kafka.group_protocol import group_protocol_refused
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit


def test_the_error_says_what_the_member_offers_and_what_to_align() -> None:
    error = group_protocol_refused("aiokafka", "billing-g", ["roundrobin"])
    assert isinstance(error, PermanentPublishError)  # the worker does not retry it
    assert isinstance(error, ConfigurationError)  # a setting to change
    assert not error.retriable
    text = str(error)
    assert "group 'billing-g'" in text
    assert "(roundrobin)" in text
    assert "partition.assignment.strategy" in text
    assert "partition_assignment_strategy" in text


class RefusedRejoin:
    async def getmany(self, timeout_ms: int, max_records: int) -> Any:
        from aiokafka.errors import InconsistentGroupProtocolError

        raise InconsistentGroupProtocolError()


def test_an_aiokafka_rejoin_refused_is_the_typed_error() -> None:
    pytest.importorskip("aiokafka")
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor

    from outboxkit.kafka import aiokafka_consumer

    consumer = aiokafka_consumer.AiokafkaGroupConsumer(
        KafkaSettings(bootstrap="127.0.0.1:1", client="aiokafka"),
        "g",
        config={"partition_assignment_strategy": (RangePartitionAssignor,)},
    )
    consumer._consumer = RefusedRejoin()  # type: ignore[assignment]
    with pytest.raises(GroupProtocolError, match=r"offers \(range\)"):
        asyncio.run(consumer.poll(0.1, 10))
