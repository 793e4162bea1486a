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

from typing import Any

import pytest

from outboxkit.errors import PublishError
from outboxkit.kafka.aiokafka_admin import AiokafkaAdmin
from outboxkit.kafka.confluent_producer import ConfluentTransactionalProducer
from outboxkit.kafka.errors import ErrorKind
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit


class _Admin:
    def __init__(self, answer: bool | Exception | None) -> None:
        self.answer = answer

    async def may_write(self, topic: str) -> bool | None:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


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
