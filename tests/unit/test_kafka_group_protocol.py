"""A join refused for want of a shared assignment strategy: what the member is told, and that
it waits instead of ending (the real-broker refusals at the join: tests/integration/
test_inbox_mixed_clients.py). aiokafka also refuses a rejoin of a running member that way,
raised out of its ``getmany``: that path is scripted here."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from outboxkit.errors import PermanentPublishError, PublishError
from outboxkit.kafka.acl import NOTICE_INTERVAL
from outboxkit.kafka.group_protocol import ProtocolNotice
from outboxkit.settings import KafkaSettings
from tests.support.clock import Clock

pytestmark = pytest.mark.unit


class Named:
    name = "roundrobin"  # as aiokafka's assignor classes name themselves


def test_the_error_says_what_the_member_offers_and_what_to_align() -> None:
    notice = ProtocolNotice(logging.getLogger("test.protocol"), "aiokafka", "billing-g", [Named()])
    error = notice.error(starting=True)
    # It heals once the members sharing nothing have left: the worker starts again.
    assert isinstance(error, PublishError)
    assert not isinstance(error, PermanentPublishError)
    assert error.retriable
    text = str(error)
    assert text.startswith("Kafka consumer could not start: ")
    assert "group 'billing-g'" in text
    assert "(roundrobin)" in text
    assert "partition.assignment.strategy" in text
    assert "partition_assignment_strategy" in text
    assert "another kind of client" in text  # the same refusal for a group id used elsewhere


def test_the_notice_is_said_once_a_notice_interval(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    clock = Clock()
    logger = logging.getLogger("test.protocol")
    notice = ProtocolNotice(logger, "confluent-kafka", "g", ["range"], clock)
    for _ in range(20):  # librdkafka asks again every few hundred milliseconds
        notice.refused()
    clock.now += NOTICE_INTERVAL
    notice.refused()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert all("offers (range)" in line for line in lines)


class RefusedRejoin:
    calls = 0

    async def getmany(self, timeout_ms: int, max_records: int) -> Any:
        from aiokafka.errors import InconsistentGroupProtocolError

        self.calls += 1
        raise InconsistentGroupProtocolError()


def test_an_aiokafka_rejoin_refused_waits_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    """aiokafka's coordinator hands the refusal to ``getmany`` and asks again: the poll returns
    nothing (after its wait), and the consumer goes on."""
    pytest.importorskip("aiokafka")
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor

    from outboxkit.kafka import aiokafka_consumer

    caplog.set_level(logging.WARNING)
    consumer = aiokafka_consumer.AiokafkaGroupConsumer(
        KafkaSettings(bootstrap="127.0.0.1:1", client="aiokafka"),
        "g",
        config={"partition_assignment_strategy": (RangePartitionAssignor,)},
    )
    refusing = RefusedRejoin()
    consumer._consumer = refusing  # type: ignore[assignment]

    async def twice() -> list[Any]:
        return [await consumer.poll(0.01, 10), await consumer.poll(0.01, 10)]

    assert asyncio.run(twice()) == [[], []]
    assert refusing.calls == 2
    said = [r.getMessage() for r in caplog.records]
    lines = [line for line in said if "INCONSISTENT_GROUP_PROTOCOL" in line]
    assert len(lines) == 1
    assert "offers (range)" in lines[0]
