"""The relay's answers to missing Kafka ACLs, without a broker (the real-broker cases are in
tests/fault/test_kafka_acls_relay.py).

* A transactional confluent producer asks whether it may write to a topic before sending:
  librdkafka fails a transaction holding a topic without Write by purging every record alike
  (``_PURGE_QUEUE``, retriable), so the shard retried it for ever. Only a clear "no" parks; an
  unknown answer (no authorizer, an older broker, a failed question) sends as before.
* aiokafka creates the checkpoint topic with the broker's ``default.replication.factor``, read as
  a broker configuration: a refused read used to be taken for 1.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Collection
from typing import Any

import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from confluent_kafka import KafkaError, KafkaException

from outboxkit.errors import PublishError
from outboxkit.kafka.aiokafka_admin import AiokafkaAdmin
from outboxkit.kafka.aiokafka_producer import _explained, _write_refused
from outboxkit.kafka.api import Delivery, RecordError
from outboxkit.kafka.confluent_admin import ConfluentAdmin
from outboxkit.kafka.confluent_checkpoint import _failed
from outboxkit.kafka.confluent_producer import ConfluentTransactionalProducer
from outboxkit.kafka.errors import ErrorKind
from outboxkit.relay.checkpoint import TOPIC_REFUSED as TOPIC
from outboxkit.relay.checkpoint import CheckpointTopic
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit


class _Admin:
    def __init__(self, answer: bool | Exception | None) -> None:
        self.answer = answer
        self.asked: list[set[str]] = []

    async def may_write(self, topics: Collection[str]) -> dict[str, bool]:
        self.asked.append(set(topics))
        if isinstance(self.answer, Exception):
            raise self.answer
        return {} if self.answer is None else dict.fromkeys(topics, self.answer)


def _producer(answer: bool | Exception | None, *, transactional: bool = True) -> Any:
    producer = ConfluentTransactionalProducer(
        KafkaSettings.plaintext("127.0.0.1:1"),
        transactional_id="outboxkit-relay.g.0" if transactional else None,
    )
    producer._admin = _Admin(answer)  # type: ignore[assignment]
    return producer


async def test_a_topic_the_broker_says_we_may_not_write_to_is_a_permanent_problem() -> None:
    problem = await _producer(False)._write_refused("orders")
    assert problem is not None
    assert problem.kind is ErrorKind.PERMANENT
    assert problem.name == "TOPIC_AUTHORIZATION_FAILED"
    assert "'orders'" in problem.message
    assert "Write" in problem.message


@pytest.mark.parametrize("answer", [True, None, PublishError("no answer within 10s")])
async def test_allowed_or_unknown_sends_as_before(answer: bool | Exception | None) -> None:
    assert await _producer(answer)._write_refused("orders") is None


class _Response:
    def __init__(self, resource: dict[str, Any]) -> None:
        self.resource = resource

    def to_object(self) -> dict[str, Any]:
        return {"resources": [self.resource]}


class _Broker:
    nodeId = 1


class _Cluster:
    def brokers(self) -> list[_Broker]:
        return [_Broker()]


class _Client:
    cluster = _Cluster()


class _ConfigAdmin:
    def __init__(self, resource: dict[str, Any]) -> None:
        self.resource = resource

    async def describe_configs(self, resources: list[Any]) -> list[_Response]:
        return [_Response(self.resource)]


def _aiokafka_admin(resource: dict[str, Any]) -> AiokafkaAdmin:
    admin = AiokafkaAdmin(KafkaSettings.plaintext("127.0.0.1:1"))
    admin._clients = (_ConfigAdmin(resource), _Client())  # type: ignore[assignment,unused-ignore]
    return admin


async def test_a_refused_broker_configuration_read_is_said_not_taken_for_one_replica() -> None:
    refused = {
        "error_code": 31,
        "error_message": "Cluster authorization failed.",
        "config_entries": [],
    }
    with pytest.raises(PublishError) as caught:
        await _aiokafka_admin(refused)._default_replication("outboxkit.relay.checkpoint")
    text = str(caught.value)
    assert "CLUSTER_AUTHORIZATION_FAILED" in text
    assert "DescribeConfigs on the Cluster" in text
    assert "'outboxkit.relay.checkpoint'" in text
    assert caught.value.context.get("error") == "CLUSTER_AUTHORIZATION_FAILED"


async def test_the_brokers_default_replication_is_used_when_readable() -> None:
    entry = {"config_names": "default.replication.factor", "config_value": "3"}
    readable = {"error_code": 0, "config_entries": [entry]}
    assert await _aiokafka_admin(readable)._default_replication("t") == 3


async def test_a_claims_new_topics_are_asked_about_in_one_request() -> None:
    """Asked one topic at a time, each waiting up to the admin's timeout, a slow broker held a
    claim K times that long; now one request, one wait, for all of them."""
    producer = _producer(False)
    await producer.ask_ahead({"a", "b", "c"})
    for name in ("a", "b", "c"):
        assert await producer._write_refused(name) is not None
    assert producer._admin.asked == [{"a", "b", "c"}]


async def test_a_failed_ask_ahead_is_unknown_for_all_and_not_asked_again() -> None:
    producer = _producer(PublishError("no answer within 10s"))
    await producer.ask_ahead({"a", "b"})
    assert await producer._write_refused("a") is None
    assert await producer._write_refused("b") is None
    assert producer._admin.asked == [{"a", "b"}]


class _Pending:
    """describe_topics futures that never complete: a broker that does not answer."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def describe_topics(self, topics: Any, **_: Any) -> dict[str, Any]:
        return {name: self._future() for name in topics.topic_names}

    def _future(self) -> Any:
        waits, future = self.waits, concurrent.futures.Future[Any]()
        result = future.result

        def waiting(timeout: float | None = None) -> Any:
            waits.append(timeout or 0.0)
            return result(timeout)

        future.result = waiting  # type: ignore[method-assign]
        return future

    def poll(self, timeout: float) -> int:
        return 0


async def test_the_write_question_shares_one_wait_across_topics() -> None:
    admin = ConfluentAdmin(KafkaSettings.plaintext("127.0.0.1:1"), timeout=0.2)
    pending = _Pending()
    real, admin._client = admin._client, pending  # type: ignore[assignment]
    try:
        assert await admin.may_write(["a", "b", "c", "d"]) == {}  # unknown: sends as before
    finally:
        admin._client = real
        await admin.close()
    assert len(pending.waits) == 4
    assert sum(pending.waits) <= 0.2  # one budget, not one per topic


class _Producer:
    def __init__(self, answer: RecordError | Exception | None) -> None:
        self.answer = answer

    async def topic_problem(self, topic: str) -> RecordError | None:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _checkpoints(reader: Any = None) -> CheckpointTopic:
    class _Kafka:
        timeout = 10.0

        def checkpoint_reader(self) -> Any:
            return reader

    checkpoints = CheckpointTopic(_Kafka(), "ckpt")  # type: ignore[arg-type]
    checkpoints._partitions = 1
    return checkpoints


async def test_a_checkpoint_topic_without_write_fails_the_takeover_naming_it() -> None:
    refused = RecordError("TOPIC_AUTHORIZATION_FAILED", "topic 'ckpt': ... (grant it Write)")
    with pytest.raises(PublishError) as caught:
        await _checkpoints().check_writable(_Producer(refused), (0, 1))  # type: ignore[arg-type]
    assert "checkpoint topic" in str(caught.value)
    assert "grant it Write" in str(caught.value)
    assert caught.value.context["error"] == "TOPIC_AUTHORIZATION_FAILED"


@pytest.mark.parametrize("answer", [None, PublishError("no answer within 10s")])
async def test_a_writable_or_unknown_checkpoint_topic_goes_on(answer: Any) -> None:
    await _checkpoints().check_writable(_Producer(answer), (0, 1))  # type: ignore[arg-type]


class _Counting(_Producer):
    asked = 0

    async def topic_problem(self, topic: str) -> RecordError | None:
        self.asked += 1
        return await super().topic_problem(topic)


async def test_a_topic_not_yet_known_is_no_refusal_and_a_term_found_writable_asks_no_more() -> None:
    """A checkpoint topic just created may not be known to the broker asked yet: not an ACL."""
    checkpoints = _checkpoints()
    missing = _Counting(RecordError("UNKNOWN_TOPIC_OR_PART", "topic 'ckpt' does not exist"))
    await checkpoints.check_writable(missing, (0, 7))  # type: ignore[arg-type]
    writable = _Counting(None)
    for _ in range(3):  # the term's later producer lives
        await checkpoints.check_writable(writable, (0, 7))  # type: ignore[arg-type]
    assert writable.asked == 0
    await checkpoints.check_writable(writable, (0, 8))  # type: ignore[arg-type]  # a new term
    assert writable.asked == 1


class _Reader:
    def __init__(self, error: PublishError) -> None:
        self.error = error

    async def last_values(self, topic: str, partition: int, keys: Any) -> dict[bytes, bytes]:
        raise self.error

    async def close(self) -> None:
        return None


async def test_a_refused_checkpoint_read_names_the_read_acl_and_keeps_its_cause() -> None:
    refused = PublishError("reading ckpt [0] failed: Topic authorization failed", error=TOPIC)
    with pytest.raises(PublishError) as caught:
        await _checkpoints(_Reader(refused)).read(0, "g", 0, {b"g/0": 0})
    assert "needs Read on the checkpoint topic 'ckpt'" in str(caught.value)
    assert caught.value.__cause__ is refused
    assert caught.value.context["error"] == TOPIC


async def test_only_the_readers_error_name_marks_a_refused_read_not_its_wording() -> None:
    other = PublishError("reading ckpt [0] failed: not a topic authorization problem")
    with pytest.raises(PublishError) as caught:
        await _checkpoints(_Reader(other)).read(0, "g", 0, {b"g/0": 0})
    assert caught.value is other


def test_the_confluent_reader_names_the_error_it_failed_with() -> None:
    error = _failed("ckpt", 0, KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
    assert error.context["error"] == TOPIC


async def test_a_broker_configuration_read_failing_otherwise_names_no_acl() -> None:
    failed = {"error_code": 7, "error_message": "Request timed out.", "config_entries": []}
    with pytest.raises(PublishError) as caught:
        await _aiokafka_admin(failed)._default_replication("outboxkit.relay.checkpoint")
    assert "DescribeConfigs" not in str(caught.value)
    assert "create the topic beforehand" in str(caught.value)
    assert caught.value.context.get("error") is None


async def test_aiokafka_names_the_topic_a_transaction_was_refused_for() -> None:
    """aiokafka fails every batch of such a transaction with a bare InvalidTxnState and keeps
    the refusal, naming the topics, in a future nothing awaits."""

    class _Manager:
        def __init__(self) -> None:
            self._transaction_waiter = asyncio.get_running_loop().create_future()
            self._transaction_waiter.set_exception(TopicAuthorizationFailedError({"ckpt"}))

    class _Aio:
        _txn_manager = _Manager()

    denied = _write_refused(_Aio())
    assert denied == {"ckpt"}
    bare = Delivery(error=RecordError("InvalidTxnState", "[Error 48]"))
    other = _explained(bare, "orders", denied)
    own = _explained(bare, "ckpt", denied)
    assert other is not None
    assert other.error is not None
    assert own is not None
    assert other.error.kind is ErrorKind.RETRIABLE
    assert "'ckpt'" in other.error.message
    assert "grant it Write" in other.error.message
    assert own.error is not None
    assert own.error.kind is ErrorKind.PERMANENT
