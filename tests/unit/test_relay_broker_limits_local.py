"""A refusal the client made before sending (``RecordError.local``) does not have the topic's
configuration read again: the client's own limits (librdkafka's ``message.max.bytes``, its queue,
aiokafka's ``max_request_size``) refuse under the broker's names, and the topic's configuration
cannot explain them. Before, each cost a needless DescribeConfigs (one per topic per minute)."""

from __future__ import annotations

from typing import Any

import pytest

from outboxkit.kafka.aiokafka_producer import AiokafkaTransactionalProducer
from outboxkit.kafka.api import Delivery, ProduceRequest, RecordError, TopicLimits
from outboxkit.kafka.confluent_producer import ConfluentTransactionalProducer, _larger_than_queue
from outboxkit.settings import KafkaSettings
from tests.unit.test_confluent_producer_queue_full import (  # no broker: librdkafka kept quiet
    MIB,
    UNREACHABLE,
    _quiet_librdkafka,  # noqa: F401  (an autouse fixture: imported, it applies here)
)
from tests.unit.test_relay_broker_limits import _CONN, TOO_LARGE, _FlakyProducer, _gate, _row, _Term

pytestmark = pytest.mark.unit

TERM: Any = _Term()
LOCAL = RecordError("MSG_SIZE_TOO_LARGE", "Broker: Message size too large", local=True)


async def test_a_refusal_made_before_sending_does_not_have_the_configuration_read_again() -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], TopicLimits(1_048_588, "delete"))
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    gate.limits.refused([("t", LOCAL)])
    await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == 1
    gate.limits.refused([("t", TOO_LARGE)])  # the same name, from the broker
    await gate.sendable(TERM, _CONN, producer, [_row(3)])
    assert producer.reads == 2


def test_the_flag_changes_neither_equality_nor_the_text_shown() -> None:
    assert LOCAL == TOO_LARGE
    assert str(LOCAL) == str(TOO_LARGE)


async def test_confluent_refusals_in_produce_are_local() -> None:
    """librdkafka checks ``message.max.bytes`` in produce(), before anything is sent."""
    settings = KafkaSettings(bootstrap=UNREACHABLE)
    producer = ConfluentTransactionalProducer(settings, transactional_id=None, timeout=5.0)
    await producer.start()
    try:
        (refused,) = await producer.send([ProduceRequest("t", b"k", b"x" * (2 * MIB))])
    finally:
        await producer.close()
    assert refused.error is not None
    assert refused.error.name == "MSG_SIZE_TOO_LARGE"
    assert refused.error.local
    request = ProduceRequest("t", b"k", b"x" * (2 * MIB))
    assert _larger_than_queue(request, {"queue.buffering.max.kbytes": 1024}).local


async def test_aiokafka_refusals_above_max_request_size_are_local() -> None:
    producer = AiokafkaTransactionalProducer(
        KafkaSettings(bootstrap=UNREACHABLE), transactional_id=None
    )
    results: list[Delivery | None] = [None]
    groups = await producer._partitioned(  # the size check needs no broker
        None,
        [ProduceRequest("t", b"k", b"x" * (2 * MIB))],
        results,
    )
    assert groups == {}
    [refused] = results
    assert refused is not None
    assert refused.error is not None
    assert refused.error.name == "MessageSizeTooLargeError"
    assert refused.error.local
