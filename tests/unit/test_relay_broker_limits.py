"""What the relay does with its topics' configurations before sending (``broker_limits``):
how a send is cut for a topic whose ``max.message.bytes`` is below the producer's batches, and
that an unreadable configuration is said once and changes nothing."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from outboxkit.errors import PublishError
from outboxkit.kafka.api import (
    NOT_SENT,
    Delivery,
    ProduceRequest,
    RecordError,
    TopicLimits,
    TransactionalProducer,
)
from outboxkit.relay.broker_limits import (
    BATCH_OVERHEAD,
    BrokerLimits,
    pieces,
    record_bound,
    send_budget,
)

pytestmark = pytest.mark.unit

TOO_LARGE = RecordError("MSG_SIZE_TOO_LARGE", "Broker: Message size too large")


def _request(topic: str, size: int, key: bytes | None = b"k") -> ProduceRequest:
    return ProduceRequest(topic, key, b"x" * size, [("event-id", b"0123")])


class _Producer(TransactionalProducer):
    """Writes down each send; refuses records of ``refused`` size; knows ``limits``."""

    def __init__(
        self,
        limits: dict[str, TopicLimits | None],
        *,
        transactional: bool = False,
        refused: int = -1,
    ) -> None:
        self.transactional = transactional
        self.largest_batch = 1_000_000
        self.sends: list[list[int]] = []
        self._limits = limits
        self._refused = refused

    async def start(self) -> None: ...

    async def topic_problem(self, topic: str) -> RecordError | None:
        return None

    async def topic_limits(self, topic: str) -> TopicLimits:
        found = self._limits[topic]
        if found is None:
            raise PublishError("configuration of topic: TOPIC_AUTHORIZATION_FAILED")
        return found

    async def begin(self) -> None: ...

    async def send(self, requests: Sequence[ProduceRequest]) -> list[Delivery]:
        self.sends.append([len(r.value) for r in requests])
        return [
            Delivery(error=TOO_LARGE) if len(r.value) == self._refused else Delivery(0, n)
            for n, r in enumerate(requests)
        ]

    async def commit(self) -> None: ...

    async def abort(self) -> None: ...

    async def close(self) -> None: ...


def test_the_bound_covers_the_record_in_its_batch() -> None:
    request = _request("t", 1000)
    # value, key, header name and value, plus the varints at their longest
    assert record_bound(request) == 1000 + 1 + len("event-id") + 4 + 36 + 10


def test_no_tight_topic_in_the_send_means_one_send() -> None:
    requests = [_request("t", 100), _request("u", 100_000)]
    assert pieces(requests, {}) is None
    assert pieces(requests, {"t": 100_000}) is None  # well under its limit


def test_a_record_that_might_be_refused_goes_alone_and_the_rest_within_the_limit() -> None:
    budget = 10_000
    requests = [
        _request("t", 100),
        _request("t", 20_000),  # above the budget: alone
        _request("t", 4000),
        _request("u", 50_000),  # another topic, not tight: not counted
        _request("t", 4000),
        _request("t", 4000),  # the third of 4000 passes the budget: a new send
    ]
    assert pieces(requests, {"t": budget}) == [1, 2, 5, 6]


def test_a_send_budget_keeps_a_margin_for_compression() -> None:
    assert send_budget(200_000) < 200_000 - BATCH_OVERHEAD


async def test_a_record_refused_in_its_own_send_stops_what_follows() -> None:
    limits = BrokerLimits(0)
    producer = _Producer({"t": TopicLimits(10_000, "delete")}, refused=20_000)
    await limits.learn(producer, "t")
    requests = [_request("t", 100), _request("t", 20_000), _request("t", 100)]
    checks: list[int] = []
    deliveries = await limits.send(producer, requests, lambda: checks.append(1))
    assert producer.sends == [[100], [20_000]]  # the last is not produced
    assert [d.error for d in deliveries] == [None, TOO_LARGE, NOT_SENT.error]
    assert limits.alone == 1
    assert checks == [1]  # the term is checked before each further send


async def test_exactly_once_sends_as_before_and_parks_keyless_records_all_the_same() -> None:
    limits = BrokerLimits(0)
    producer = _Producer({"t": TopicLimits(10_000, "compact,delete")}, transactional=True)
    await limits.learn(producer, "t")
    requests = [_request("t", 100), _request("t", 20_000), _request("t", 100)]
    await limits.send(producer, requests, lambda: None)
    assert producer.sends == [[100, 20_000, 100]]
    assert limits.alone is None
    [refused] = limits.keyless_refused({"t", "u"}).values()
    assert "'t' has cleanup.policy=compact,delete" in str(refused)


async def test_a_topic_at_or_above_the_producers_batches_is_not_cut() -> None:
    limits = BrokerLimits(0)
    producer = _Producer({"t": TopicLimits(1_048_588, "delete")})
    await limits.learn(producer, "t")
    await limits.send(producer, [_request("t", 900_000), _request("t", 900_000)], lambda: None)
    assert producer.sends == [[900_000, 900_000]]
    assert limits.keyless_refused({"t"}) == {}


async def test_an_unreadable_configuration_is_said_once_per_topic_and_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limits = BrokerLimits(3)
    producer = _Producer({"t": None})
    with caplog.at_level(logging.WARNING, "outboxkit.relay.shard_worker"):
        await limits.learn(producer, "t")
        limits.forget()  # a new producer life asks again, and says nothing new
        await limits.learn(producer, "t")
    [record] = caplog.records
    message = record.getMessage()
    assert "configuration of topic 't' cannot be read" in message
    assert "DescribeConfigs" in message
    assert "at_least_once per-key order" in message
    requests = [_request("t", 100), _request("t", 20_000)]
    await limits.send(producer, requests, lambda: None)
    assert producer.sends == [[100, 20_000]]


@pytest.mark.parametrize(
    ("policy", "compacted"),
    [("compact", True), ("compact,delete", True), ("[delete, compact]", True), ("delete", False)],
)
def test_which_cleanup_policies_compact(policy: str, compacted: bool) -> None:
    assert TopicLimits(None, policy).compacted is compacted
