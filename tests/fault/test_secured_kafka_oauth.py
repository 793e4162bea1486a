"""SASL OAUTHBEARER on a real broker, given the way a user gives it: no typed SASL setting,
``security_protocol`` SASL_SSL, the CA, and the mechanism with librdkafka's token options in
``OUTBOXKIT_KAFKA_PROPERTIES``.

The relay (exactly-once: transactional producer, checkpoint reader, admin) and a consumer with
dead letters and acknowledgements (consumer, dead-letter and acks producers, admin) run as
processes configured by ``OUTBOXKIT_KAFKA_*`` variables only. The broker is this module's own:
the dev stack's SASL_SSL Kafka with OAUTHBEARER (Kafka's unsecured JWTs) offered beside SCRAM.
Its loopback PLAINTEXT listener is used by the test alone, to create topics and read them back.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outboxkit.devstack import KafkaServer
from tests.fault.test_secured_kafka import ROOT, Processes, _create_topics, seed_payments
from tests.integration.inbox_support import effects, inbox_row
from tests.support.brokers import own_broker as any_broker
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault


def own_broker(**options: Any) -> Iterator[KafkaServer]:
    """A SASL_SSL broker with OAUTHBEARER of a test module's own (``options``: more of
    :class:`KafkaServer`'s)."""
    yield from any_broker(security="sasl_ssl", oauthbearer=True, **options)


@pytest.fixture(scope="module")
def oauth_kafka() -> Iterator[KafkaServer]:
    yield from own_broker()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path)
    yield running
    running.stop()


def _env(db_url: str, server: KafkaServer, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
    env.update(server.oauthbearer.env())
    env.update(
        OUTBOXKIT_DATABASE_URL=db_url,
        OUTBOXKIT_RELAY_POLL_INTERVAL="0.2",
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


def test_relay_and_consumer_over_oauthbearer_from_variables_only(
    oauth_kafka: KafkaServer,
    outboxkit_db_url: str,
    sa_url: str,
    processes: Processes,
) -> None:
    server = oauth_kafka
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    acks = f"{topic}.acks"
    _create_topics(server, topic, f"{topic}.dlq", acks)
    ok_ids, dead_id = seed_payments(outboxkit_db_url, sa_url, topic)

    env = _env(
        outboxkit_db_url,
        server,
        OUTBOXKIT_KAFKA_CLIENT="confluent",
        OUTBOXKIT_CONSUMER_NAME="billing",
        OUTBOXKIT_CONSUMER_GROUP=f"g-{uuid.uuid4().hex[:8]}",
        OUTBOXKIT_CONSUMER_TOPICS=topic,
        OUTBOXKIT_CONSUMER_ACKS_TOPIC=acks,
        OUTBOXKIT_CONSUMER_MAX_ATTEMPTS="2",
        OUTBOXKIT_CONSUMER_RETRY_DELAY="0.1",
    )
    assert "OUTBOXKIT_KAFKA_SASL_MECHANISM" not in env  # nothing but the properties name it
    processes.start(["relay", "run"], env)
    processes.start(["inbox", "run", "--registry", "tests.fault.consumer_app:SYNC"], env)

    def settled() -> bool:
        done = [inbox_row(outboxkit_db_url, "billing", e) or {} for e in [*ok_ids, dead_id]]
        return all(row.get("state") in ("succeeded", "dead") for row in done)

    try:
        wait_for(settled, timeout=120, what="every event settled")
    except AssertionError as exc:  # the processes' output as it is then, not as it was at start
        raise AssertionError(f"{exc}; output:\n{processes.output()}") from None
    assert sorted(e[0] for e in effects(outboxkit_db_url) if e[0] in ok_ids) == sorted(ok_ids)
    assert (inbox_row(outboxkit_db_url, "billing", dead_id) or {})["state"] == "dead"
    plain = server.plaintext_bootstrap
    published = read_topic(plain, topic, expect=6, quiet=1.0)
    assert len(published) == 6  # exactly once into Kafka
    dead_letters = read_topic(plain, f"{topic}.dlq", expect=1, quiet=0.5)
    assert [dict(m.headers())["dlq-event-id"].decode() for m in dead_letters] == [dead_id]
    acked = {
        body["event_id"]: body["state"]
        for body in (json.loads(m.value()) for m in read_topic(plain, acks, expect=6, quiet=0.5))
    }
    assert acked == {**dict.fromkeys(ok_ids, "succeeded"), dead_id: "dead"}
    # The relay's exactly-once checkpoint went through its own transactions on this broker.
    assert read_topic(plain, "outboxkit.relay.checkpoint", expect=1, quiet=0.5)
    processes.stop()
    output = processes.output()
    assert "Traceback" not in output
    # Property values are shown nowhere (here a principal; in production a client secret).
    assert f"principal={server.oauthbearer.principal}" not in output


def test_aiokafka_is_refused_with_a_typed_error(
    oauth_kafka: KafkaServer, outboxkit_db_url: str, processes: Processes
) -> None:
    """aiokafka reads no librdkafka property: it would not log in with OAUTHBEARER."""
    env = _env(outboxkit_db_url, oauth_kafka, OUTBOXKIT_KAFKA_CLIENT="aiokafka")
    index = processes.start(["relay", "run"], env)
    proc = processes.procs[index][0]
    assert proc.wait(60) != 0, processes.output(index)
    output = processes.output(index)
    assert "only the confluent-kafka clients read" in output, output
    assert "OUTBOXKIT_KAFKA_CLIENT to confluent" in output
    assert "Traceback" not in output
