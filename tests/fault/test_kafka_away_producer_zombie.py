"""A confluent-kafka producer given up while Kafka was away must not fence the one after it.

librdkafka goes on asking for a producer id after ``init_transactions`` timed out. The relay
closes such a producer and, at its next retry, starts another with the same transactional id.
Closing it used to drop only our reference; an exception of its start, kept by a task's
reference cycle until the garbage collector ran, kept the handle alive. Once Kafka answered,
the old handle's request bumped the epoch and fenced the new producer: after an outage the
relay logged "lease lost (fenced)" and started over. Now the handle of a producer whose start
failed is ended when it is closed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from outboxkit.devstack import DevStack
from outboxkit.errors import PublishError
from outboxkit.kafka import KafkaClients
from outboxkit.kafka.api import ProduceRequest
from outboxkit.settings import KafkaClient, KafkaSettings

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]
TIMEOUT = 3  # the producers' timeout, seconds


@pytest.mark.filterwarnings("ignore:Producer abort_transaction failed during close")
async def test_a_producer_given_up_during_an_outage_does_not_fence_its_successor(
    outboxkit_stack: DevStack, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    pytest.importorskip("confluent_kafka")
    if outboxkit_stack.kafka is None:
        pytest.skip("external Kafka: cannot stop it")
    topic = outboxkit_topic()
    settings = KafkaSettings(bootstrap=outboxkit_kafka_bootstrap, client=KafkaClient.CONFLUENT)
    clients = KafkaClients(settings, timeout=TIMEOUT)
    transactional_id = f"outboxkit-test-zombie-{uuid.uuid4().hex[:8]}"
    first = clients.transactional_producer(transactional_id)  # the id known to its coordinator
    await first.start()
    await first.close()

    kept: list[BaseException] = []  # as a task's reference cycle keeps a failed start's error
    outboxkit_stack.kafka.stop()
    try:
        given_up = clients.transactional_producer(transactional_id)
        with pytest.raises(PublishError, match="init_transactions") as failed:
            await given_up.start()
        kept.append(failed.value)
        handle = given_up._producer  # type: ignore[attr-defined]
        await given_up.close()
    finally:
        outboxkit_stack.kafka.start()
    if hasattr(handle, "close"):  # confluent-kafka 2.13 and later can end a handle
        with pytest.raises(RuntimeError):
            handle.list_topics(timeout=0.1)  # ended: a call on it is refused

    # Its own timeout is longer: the restarted broker may still be loading the transaction log
    # (NOT_COORDINATOR, which librdkafka retries within the timeout; 3 s fell short once on a
    # busy machine). The old handle's request, had it lived, would come within it all the same.
    successor = KafkaClients(settings, timeout=60).transactional_producer(transactional_id)
    try:
        await successor.start()
        for n in range(10):  # the old handle's request, had it lived, lands within these
            await successor.begin()
            deliveries = await successor.send([ProduceRequest(topic, b"k", str(n).encode())])
            assert [d.error for d in deliveries] == [None]
            await successor.commit()
    finally:
        await successor.close()
