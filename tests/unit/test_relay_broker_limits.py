"""What the relay does with its topics' configurations before sending (``broker_limits``):
how a send is cut for a topic whose ``max.message.bytes`` is below the producer's batches or
records, and that an unreadable configuration is said by its cause, changes nothing and (unless
an ACL is missing) is read again later."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import SecretStr

from outboxkit.errors import PublishError
from outboxkit.kafka.aiokafka_producer import AiokafkaTransactionalProducer
from outboxkit.kafka.api import (
    NOT_SENT,
    Delivery,
    ProduceRequest,
    RecordError,
    TopicLimits,
    TransactionalProducer,
)
from outboxkit.kafka.confluent_producer import ConfluentTransactionalProducer
from outboxkit.relay.broker_limits import (
    BATCH_OVERHEAD,
    READ_BUDGET,
    RETRY_AFTER,
    BrokerLimits,
    pieces,
    record_bound,
    send_budget,
)
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.reader import OutboxRecord
from outboxkit.relay.topic_gate import TopicGate
from outboxkit.settings import KafkaSettings

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
        largest_record: int = 1_000_000,
    ) -> None:
        self.transactional = transactional
        self.largest_batch = 1_000_000
        self.largest_record = largest_record
        self.sends: list[list[int]] = []
        self._limits = limits
        self._refused = refused

    async def start(self) -> None: ...

    async def topic_problem(self, topic: str) -> RecordError | None:
        return None

    async def topic_limits(self, topic: str) -> TopicLimits:
        found = self._limits[topic]
        if found is None:
            raise PublishError(
                "configuration of topic: TOPIC_AUTHORIZATION_FAILED",
                error="TOPIC_AUTHORIZATION_FAILED",
            )
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
    assert "configuration of topic 't' may not be read" in message
    assert "needs DescribeConfigs" in message
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


class _FlakyProducer(_Producer):
    """Its configuration reads fail with ``failures`` in turn, then succeed."""

    def __init__(self, failures: list[Exception], limits: TopicLimits) -> None:
        super().__init__({"t": limits})
        self.failures = failures
        self.reads = 0

    async def topic_limits(self, topic: str) -> TopicLimits:
        self.reads += 1
        if self.failures:
            raise self.failures.pop(0)
        return await super().topic_limits(topic)


class _Term:
    def check(self) -> None: ...


_CONN: Any = None  # the gate uses the connection only to park


class _Store:
    def __init__(self) -> None:
        self.defects: dict[int, str] = {}


def _gate(clock: list[float]) -> TopicGate:
    gate = TopicGate(
        0,
        _Store(),  # type: ignore[arg-type]
        RelayMetrics(),
        wait_behind_parked=True,
        checkpoint_topic="outboxkit-checkpoints",
    )
    gate.limits._clock = lambda: clock[0]
    return gate


def _row(n: int, size: int = 10) -> OutboxRecord:
    return OutboxRecord(
        n, f"e{n}", f"i{n}", "t", "k", b"x" * size, "a", None, None, None, None, None, 0
    )


@pytest.mark.parametrize("transactional", [False, True])
async def test_a_timed_out_read_is_said_by_its_cause_and_never_ends_the_term(
    transactional: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """confluent-kafka's future.result() raised a bare TimeoutError through the term."""
    producer = _FlakyProducer([TimeoutError()], TopicLimits(10_000, "delete"))
    producer.transactional = transactional
    gate = _gate([0.0])
    with caplog.at_level(logging.WARNING, "outboxkit.relay.shard_worker"):
        claim = [_row(1)]
        assert await gate.sendable(_Term(), _CONN, producer, claim) == claim  # type: ignore[arg-type]
    [record] = caplog.records
    message = record.getMessage()
    assert "configuration of topic 't' could not be read (TimeoutError" in message
    assert "DescribeConfigs" not in message  # not an ACL: the cause is named instead


async def test_a_failed_read_is_tried_again_at_a_later_claim_after_its_back_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One transient failure disabled the protection for the producer's whole life, and said
    nothing of later ones."""
    failure = PublishError("configuration of topic 't': no answer within 10s")
    producer = _FlakyProducer([failure, failure], TopicLimits(10_000, "delete"))
    clock = [100.0]
    gate = _gate(clock)
    term: Any = _Term()
    with caplog.at_level(logging.WARNING, "outboxkit.relay.shard_worker"):
        await gate.sendable(term, _CONN, producer, [_row(1)])
        clock[0] += RETRY_AFTER / 2  # within the back-off: not asked, publishing goes on
        await gate.sendable(term, _CONN, producer, [_row(2)])
        assert producer.reads == 1
        clock[0] += RETRY_AFTER / 2
        await gate.sendable(term, _CONN, producer, [_row(3)])  # fails again: said again
        assert producer.reads == 2
        gate.forget()  # a new producer life keeps the back-off
        await gate.sendable(term, _CONN, producer, [_row(4)])
        assert producer.reads == 2
        clock[0] += RETRY_AFTER
        await gate.sendable(term, _CONN, producer, [_row(5)])  # read: the topic is tight now
    assert producer.reads == 3
    assert ["no answer within 10s" in r.getMessage() for r in caplog.records] == [True, True]
    await gate.limits.send(producer, [_request("t", 100), _request("t", 20_000)], lambda: None)
    assert producer.sends == [[100], [20_000]]
    await gate.sendable(term, _CONN, producer, [_row(6)])
    assert producer.reads == 3  # read once per producer life


async def test_a_missing_acl_is_said_once_per_topic_and_not_asked_again_before_due(
    caplog: pytest.LogCaptureFixture,
) -> None:
    denied = PublishError("denied", error="CLUSTER_AUTHORIZATION_FAILED")
    producer = _FlakyProducer([denied, denied, denied], TopicLimits(10_000, "delete"))
    clock = [0.0]
    gate = _gate(clock)
    term: Any = _Term()
    with caplog.at_level(logging.WARNING, "outboxkit.relay.shard_worker"):
        await gate.sendable(term, _CONN, producer, [_row(1)])
        clock[0] += RETRY_AFTER * 2
        await gate.sendable(term, _CONN, producer, [_row(2)])
        assert producer.reads == 1
        gate.forget()
        await gate.sendable(term, _CONN, producer, [_row(3)])
    assert producer.reads == 2
    [record] = caplog.records
    assert "needs DescribeConfigs" in record.getMessage()


async def test_a_producer_sending_large_records_alone_does_not_cut_its_batches() -> None:
    """Its single-record limit above the topic's: only a record that might be refused goes
    alone; its batches of several (batch.size) stay below the limit, so nothing else is cut."""
    limits = BrokerLimits(0)
    producer = _Producer({"t": TopicLimits(1_048_588, "delete")}, largest_record=10_000_000)
    await limits.learn(producer, "t")
    many = [_request("t", 2000) for _ in range(4000)]
    await limits.send(producer, many, lambda: None)
    assert len(producer.sends) == 1
    producer.sends.clear()
    await limits.send(
        producer, [_request("t", 100), _request("t", 2_000_000), _request("t", 100)], lambda: None
    )
    assert producer.sends == [[100], [2_000_000], [100]]


def _raised(client: str) -> TransactionalProducer:
    settings = KafkaSettings.plaintext("127.0.0.1:1")
    if client == "confluent":
        settings = settings.model_copy(
            update={"properties": {"message.max.bytes": SecretStr("10000000")}}
        )
        return ConfluentTransactionalProducer(settings, transactional_id=None)
    return AiokafkaTransactionalProducer(
        settings, transactional_id=None, max_request_size=10_000_000
    )


@pytest.mark.parametrize("client", ["confluent", "aiokafka"])
async def test_raising_the_single_record_limit_does_not_make_default_topics_tight(
    client: str,
) -> None:
    """message.max.bytes (max_request_size) raised made every default topic tight: a claim of
    4,000 rows of 2 KB went in 9 sends, awaited in turn."""
    producer = _raised(client)
    assert producer.largest_record == 10_000_000
    sends: list[int] = []

    async def send(requests: Sequence[ProduceRequest]) -> list[Delivery]:
        sends.append(len(requests))
        return [Delivery(0, n) for n in range(len(requests))]

    async def topic_limits(topic: str) -> TopicLimits:
        return TopicLimits(1_048_588, "delete")  # the broker's default

    producer.send = send  # type: ignore[method-assign]
    producer.topic_limits = topic_limits  # type: ignore[method-assign]
    limits = BrokerLimits(0)
    await limits.learn(producer, "t")
    await limits.send(producer, [_request("t", 2000) for _ in range(4000)], lambda: None)
    assert sends == [4000]


def _row_of(n: int, topic: str) -> OutboxRecord:
    return _row(n)._replace(topic=topic)


class _SlowProducer(_Producer):
    """Each configuration read takes ``takes`` seconds of ``clock``; reads of ``stalled``
    topics never answer."""

    def __init__(self, clock: list[float], takes: float, stalled: frozenset[str] = frozenset()):
        super().__init__({t: TopicLimits(10_000, "delete") for t in ("a", "b", "c")})
        self.clock, self.takes, self.stalled = clock, takes, stalled
        self.read: list[str] = []

    async def topic_limits(self, topic: str) -> TopicLimits:
        self.read.append(topic)
        if topic in self.stalled:
            await asyncio.Event().wait()
        self.clock[0] += self.takes
        return await super().topic_limits(topic)


async def test_the_reads_of_one_claim_share_one_deadline_and_a_late_topic_is_read_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each read had its own timeout, one topic after another: a stalled broker held a claim
    for a timeout per topic."""
    clock = [0.0]
    gate = _gate(clock)
    producer = _SlowProducer(clock, takes=READ_BUDGET * 0.6)
    claim = [_row_of(1, "a"), _row_of(2, "b"), _row_of(3, "c")]
    term: Any = _Term()
    with caplog.at_level(logging.WARNING, "outboxkit.relay.shard_worker"):
        assert await gate.sendable(term, _CONN, producer, claim) == claim
    assert len(producer.read) == 2  # the deadline passed after the second read
    [late] = {"a", "b", "c"} - set(producer.read)
    [record] = caplog.records
    assert f"configuration of topic {late!r} could not be read (TimeoutError" in record.getMessage()
    await gate.sendable(term, _CONN, producer, claim)
    assert len(producer.read) == 2  # like a failed read: not asked before its back-off
    clock[0] += RETRY_AFTER
    await gate.sendable(term, _CONN, producer, claim)
    assert producer.read[2:] == [late]


async def test_a_read_that_never_answers_ends_at_the_claims_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [0.0]
    gate = _gate(clock)
    gate.limits.read_budget = 0.01  # real seconds: the stalled read is abandoned after them
    producer = _SlowProducer(clock, takes=0.0, stalled=frozenset({"a"}))
    claim = [_row_of(1, "a")]
    with caplog.at_level(logging.WARNING, "outboxkit.relay.shard_worker"):
        assert await gate.sendable(_Term(), _CONN, producer, claim) == claim  # type: ignore[arg-type]
    [record] = caplog.records
    assert "topic 'a' could not be read (TimeoutError: no answer in time)" in record.getMessage()
    assert gate.limits.unlearned({"a"}) == []  # failed: waits for its back-off
    clock[0] += RETRY_AFTER
    assert gate.limits.unlearned({"a"}) == ["a"]


async def test_a_topic_whose_limit_equals_the_producers_batches_is_cut() -> None:
    """A full batch of incompressible data may pass the limit once compressed: the batch size
    is held against the send budget, not the limit."""
    limits = BrokerLimits(0)
    producer = _Producer({"t": TopicLimits(1_000_000, "delete")})
    assert producer.largest_batch == 1_000_000
    await limits.learn(producer, "t")
    await limits.send(producer, [_request("t", 499_000), _request("t", 499_000)], lambda: None)
    assert producer.sends == [[499_000], [499_000]]


async def test_a_topic_whose_limit_equals_the_producers_largest_record_sends_it_alone() -> None:
    limits = BrokerLimits(0)
    producer = _Producer({"t": TopicLimits(1_000_000, "delete")}, largest_record=1_000_000)
    producer.largest_batch = 16_384
    await limits.learn(producer, "t")
    requests = [_request("t", 100), _request("t", 999_000), _request("t", 100)]
    await limits.send(producer, requests, lambda: None)
    assert producer.sends == [[100], [999_000], [100]]
