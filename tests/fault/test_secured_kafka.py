"""A secured (SASL_SSL) Kafka reached by every client the product creates, from settings alone.

The relay (exactly-once: transactional producer, checkpoint reader, admin) and a consumer with a
dead letter (consumer, dead-letter producer) run as real processes whose Kafka settings are only
``OUTBOXKIT_KAFKA_*`` variables, over each Kafka client. The broker is the dev stack's SASL_SSL
Kafka (SCRAM-SHA-512, a CA made at start-up); its unauthenticated loopback listener is used
only by the test itself, to create topics and read them back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from outboxkit import Message, Outbox
from outboxkit.devstack import KafkaServer
from outboxkit.devstack.aio import run_coroutine
from outboxkit.kafka import KafkaClients
from outboxkit.settings import KafkaSettings, SecurityProtocol
from tests.integration.inbox_support import (
    EFFECT_DDL,
    EVENT_TYPE,
    PaymentRequested,
    effects,
    inbox_row,
)
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

ROOT = Path(__file__).resolve().parents[2]
OUTBOXKIT = str(Path(sys.executable).parent / "outboxkit")
CLIENTS = [pytest.param("confluent", id="confluent"), pytest.param("aiokafka", id="aiokafka")]


def _create_topics(server: KafkaServer, *names: str) -> None:
    create_topics_at(server.plaintext_bootstrap, *names)


def create_topics_at(bootstrap: str, *names: str) -> None:
    """Topics of one partition, made over an unauthenticated listener (test set-up)."""
    settings = KafkaSettings(bootstrap=bootstrap, security_protocol=SecurityProtocol.PLAINTEXT)

    async def create() -> None:
        admin = KafkaClients(settings, timeout=60.0).admin()
        try:
            for name in names:
                await admin.create_topic(name, 1, {}, replication_factor=1)
        finally:
            await admin.close()

    run_coroutine(create())


class Processes:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, args: list[str], env: dict[str, str]) -> int:
        log = self.tmp_path / f"proc-{len(self.procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([OUTBOXKIT, *args], env=env, cwd=ROOT, stdout=out, stderr=out)
        self.procs.append((proc, log))
        return len(self.procs) - 1

    def output(self, index: int | None = None) -> str:
        chosen = self.procs if index is None else [self.procs[index]]
        return "\n".join(log.read_text(errors="replace") for _, log in chosen)

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path)
    yield running
    running.stop()


def _env(db_url: str, server: KafkaServer, client: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
    env.update(server.sasl_ssl.env())
    env.update(
        OUTBOXKIT_DATABASE_URL=db_url,
        OUTBOXKIT_KAFKA_CLIENT=client,
        OUTBOXKIT_RELAY_POLL_INTERVAL="0.2",
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


def _message(topic: str, order_id: str, amount: int) -> Message:
    event = PaymentRequested(order_id=order_id, amount=amount)
    return Message(topic=topic, payload=event, key=order_id, event_type=EVENT_TYPE)


def seed_payments(db_url: str, sa_url: str, topic: str) -> tuple[list[str], str]:
    """The effect table, five payments to succeed and one whose handler fails: their ids."""
    with psycopg.connect(db_url) as conn:
        conn.execute(EFFECT_DDL)
    engine = create_engine(sa_url)
    with Session(engine) as session, session.begin():
        written = Outbox().add_many(session, [_message(topic, f"o-{n}", n) for n in range(5)])
        dead = Outbox().add(session, _message(topic, "fail-1", 1))
    engine.dispose()
    return [str(result.event_id) for result in written], str(dead.event_id)


@pytest.mark.parametrize("client", CLIENTS)
def test_relay_and_consumer_over_sasl_ssl_from_variables_only(
    client: str,
    outboxkit_secure_kafka: KafkaServer,
    outboxkit_db_url: str,
    sa_url: str,
    processes: Processes,
) -> None:
    server = outboxkit_secure_kafka
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    _create_topics(server, topic, f"{topic}.dlq")
    ok_ids, dead_id = seed_payments(outboxkit_db_url, sa_url, topic)

    env = _env(
        outboxkit_db_url,
        server,
        client,
        OUTBOXKIT_CONSUMER_NAME="billing",
        OUTBOXKIT_CONSUMER_GROUP=f"g-{uuid.uuid4().hex[:8]}",
        OUTBOXKIT_CONSUMER_TOPICS=topic,
        OUTBOXKIT_CONSUMER_MAX_ATTEMPTS="2",
        OUTBOXKIT_CONSUMER_RETRY_DELAY="0.1",
    )
    registry = "SYNC" if client == "confluent" else "ASYNC"
    processes.start(["relay", "run"], env)
    processes.start(["inbox", "run", "--registry", f"tests.fault.consumer_app:{registry}"], env)

    def settled() -> bool:
        done = [inbox_row(outboxkit_db_url, "billing", e) or {} for e in [*ok_ids, dead_id]]
        return all(row.get("state") in ("succeeded", "dead") for row in done)

    wait_for(settled, timeout=180, what=f"every event settled; output:\n{processes.output()}")
    assert sorted(e[0] for e in effects(outboxkit_db_url) if e[0] in ok_ids) == sorted(ok_ids)
    assert (inbox_row(outboxkit_db_url, "billing", dead_id) or {})["state"] == "dead"
    dead_letters = read_topic(server.plaintext_bootstrap, f"{topic}.dlq", expect=1, quiet=1.0)
    assert [dict(m.headers())["dlq-event-id"].decode() for m in dead_letters] == [dead_id]
    published = read_topic(server.plaintext_bootstrap, topic, expect=6, quiet=1.0)
    assert len(published) == 6  # exactly once into Kafka
    processes.stop()
    output = processes.output()
    assert server.sasl_ssl.password not in output
    db_password = psycopg.conninfo.conninfo_to_dict(outboxkit_db_url).get("password")
    assert db_password
    assert str(db_password) not in output


@pytest.mark.parametrize("client", CLIENTS)
def test_wrong_password_is_named_and_never_shown(
    client: str,
    outboxkit_secure_kafka: KafkaServer,
    outboxkit_db_url: str,
    processes: Processes,
) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}"
    env = _env(
        outboxkit_db_url,
        outboxkit_secure_kafka,
        client,
        OUTBOXKIT_KAFKA_SASL_PASSWORD=wrong,
        # The refusal is reported when the first Kafka call gives up, 30 s by default.
        OUTBOXKIT_RELAY_KAFKA_TIMEOUT="5",
    )
    index = processes.start(["relay", "run"], env)
    deadline = time.monotonic() + 90
    while "OUTBOXKIT_KAFKA_SASL_PASSWORD" not in processes.output(index):
        assert time.monotonic() < deadline, processes.output(index)
        time.sleep(0.2)
    processes.stop()
    output = processes.output(index)
    assert wrong not in output
    assert outboxkit_secure_kafka.sasl_ssl.password not in output
    assert "Traceback" not in output
