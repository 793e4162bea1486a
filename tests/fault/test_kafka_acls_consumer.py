"""The consumer (``outboxkit inbox run``) on a broker with Kafka's ACL authorizer.

docs/security.md ("Kafka ACLs per principal") lists what the consumer's principal needs: Read
and Describe on its topics, Read on its group, Write and Describe on its dead-letter topic and
its acknowledgements topic. With exactly those it works; with one missing it says what to grant,
loses nothing and holds no partition for ever; once granted it carries on without a restart
(but aiokafka's refused group at start-up, which ends the process). Read taken away while it
runs, and Write on the dead-letter and acks topics, are met the same way. The broker is this
module's own; its loopback PLAINTEXT listener (a super user) is the test's, to create topics,
produce the events and read the published records back.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
)

from outboxkit.devstack import KafkaServer
from tests.fault.test_secured_kafka import CLIENTS, ROOT, Processes, _create_topics
from tests.integration.inbox_support import EFFECT_DDL, effects, inbox_row, produce_event
from tests.support.brokers import own_broker
from tests.support.kafka_acls import Acl, grant, group, may_write, revoke, revoke_all, topic
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

READ, WRITE, DESCRIBE = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE


@pytest.fixture(scope="module")
def acl_kafka() -> Iterator[KafkaServer]:
    yield from own_broker(security="sasl_ssl", authorizer=True)


@pytest.fixture
def processes(tmp_path: Path, acl_kafka: KafkaServer) -> Iterator[Processes]:
    running = Processes(tmp_path)
    yield running
    running.stop()
    revoke_all(acl_kafka)


@dataclass(frozen=True)
class Setup:
    """One consumer's names: its topic, dead-letter and acks topics, group, and the events."""

    server: KafkaServer
    db_url: str
    topic: str
    group: str

    @property
    def dlq(self) -> str:
        return f"{self.topic}.dlq"

    @property
    def acks(self) -> str:
        return f"{self.topic}.acks"

    def documented(self) -> list[Acl]:
        """Exactly what docs/security.md lists for a consumer with dead letters and acks."""
        return [
            topic(self.topic, READ, DESCRIBE),
            group(self.group, READ),
            topic(self.dlq, WRITE, DESCRIBE),
            topic(self.acks, WRITE, DESCRIBE),
        ]

    def send(self, order_id: str) -> str:
        event_id = str(uuid.uuid4())
        produce_event(self.server.plaintext_bootstrap, self.topic, event_id, order_id, 1)
        return event_id

    def state(self, event_id: str) -> str | None:
        return (inbox_row(self.db_url, "billing", event_id) or {}).get("state")

    def acked(self, expect: int) -> dict[str, str]:
        records = read_topic(self.server.plaintext_bootstrap, self.acks, expect=expect, quiet=0.5)
        return {
            body["event_id"]: body["state"] for body in (json.loads(r.value()) for r in records)
        }


@pytest.fixture
def setup(acl_kafka: KafkaServer, outboxkit_db_url: str) -> Setup:
    name = f"payments-{uuid.uuid4().hex[:8]}"
    made = Setup(acl_kafka, outboxkit_db_url, name, f"g-{uuid.uuid4().hex[:8]}")
    _create_topics(acl_kafka, made.topic, made.dlq, made.acks)
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    return made


def start(processes: Processes, setup: Setup, client: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
    env.update(setup.server.sasl_ssl.env())
    env.update(
        OUTBOXKIT_DATABASE_URL=setup.db_url,
        OUTBOXKIT_KAFKA_CLIENT=client,
        OUTBOXKIT_CONSUMER_NAME="billing",
        OUTBOXKIT_CONSUMER_GROUP=setup.group,
        OUTBOXKIT_CONSUMER_TOPICS=setup.topic,
        OUTBOXKIT_CONSUMER_ACKS_TOPIC=setup.acks,
        OUTBOXKIT_CONSUMER_MAX_ATTEMPTS="1",
        PYTHONPATH=str(ROOT),
    )
    registry = "SYNC" if client == "confluent" else "ASYNC"
    return processes.start(
        ["inbox", "run", "--registry", f"tests.fault.consumer_app:{registry}"], env
    )


def settle(processes: Processes, predicate: Callable[[], Any], what: str) -> Any:
    """:func:`wait_for`, failing with the processes' output as it is then."""
    try:
        return wait_for(predicate, timeout=60, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; output:\n{processes.output()}") from None


def wait_output(processes: Processes, text: str, what: str) -> None:
    settle(processes, lambda: text in processes.output(), what)


def without(acls: list[Acl], name: str, operation: AclOperation) -> list[Acl]:
    """``acls`` less ``operation`` on the resource ``name``."""
    return [
        Acl(a.resource, a.name, tuple(o for o in a.operations if (a.name, o) != (name, operation)))
        for a in acls
    ]


def running(processes: Processes, index: int) -> bool:
    """True, or an assertion error with the output: a process that exited is a failure."""
    proc = processes.procs[index][0]
    assert proc.poll() is None, f"exited {proc.returncode}:\n{processes.output()}"
    return True


@pytest.mark.parametrize("client", CLIENTS)
def test_write_missing_on_dead_letter_and_acks_topics_then_revoked_while_running(
    client: str, setup: Setup, processes: Processes
) -> None:
    """Without Write on either, Kafka gives the idempotent producer no id: nothing holds a
    partition, the outcome is in the database, the error says what to grant. Once granted
    (the documented ACLs, exactly) the same process handles, dead-letters and acknowledges;
    Write then revoked and granted again is met the same way (:func:`_revoked_while_running`)."""
    granted = without(without(setup.documented(), setup.dlq, WRITE), setup.acks, WRITE)
    grant(setup.server, *granted)
    ok, poisoned = setup.send("o-1"), setup.send("fail-1")
    index = start(processes, setup, client)
    settle(
        processes,
        lambda: setup.state(ok) == "succeeded" and setup.state(poisoned) == "dead",
        "both settled",
    )
    row = inbox_row(setup.db_url, "billing", poisoned) or {}
    assert row["last_error"].startswith(f"dead letter could not be published to {setup.dlq!r}")
    # No Write on any topic: Kafka gives the idempotent producer no id, and says "Cluster".
    assert "Write and Describe on its dead-letter and acks topics" in row["last_error"]
    for event_id in (ok, poisoned):
        wait_output(processes, f"acknowledgement for {event_id} (", "the ack given up")
    output = processes.output()
    assert f"publish to {setup.acks!r} failed" in output
    assert output.count(" given up after 1 failed publish(es)") == 2  # at once: no retry fixes it
    # Granted: the same process publishes again, nothing restarted. A refused producer id holds
    # for REFUSAL_PAUSE (no producer made per record meanwhile), and the broker applies a grant
    # a moment later: events are sent one by one until one is acknowledged.
    grant(setup.server, topic(setup.dlq, WRITE), topic(setup.acks, WRITE))
    probes: list[str] = []
    for n in range(30):
        probes.append(setup.send(f"o-probe-{n}"))
        settle(processes, lambda: setup.state(probes[-1]) == "succeeded", "the probe handled")
        if set(probes) & set(setup.acked(0)):
            break
    else:
        raise AssertionError(f"no acknowledgement after the grant:\n{processes.output()}")
    acked_before = setup.acked(0)
    ok2, poisoned2 = setup.send("o-2"), setup.send("fail-2")
    acked = setup.acked(len(acked_before) + 2)
    assert {ok2: acked.get(ok2), poisoned2: acked.get(poisoned2)} == {
        ok2: "succeeded",
        poisoned2: "dead",
    }
    dead = read_topic(setup.server.plaintext_bootstrap, setup.dlq, expect=1, quiet=0.5)
    assert [dict(m.headers())["dlq-event-id"].decode() for m in dead] == [poisoned2]
    assert sorted(e[0] for e in effects(setup.db_url)) == sorted([ok, *probes, ok2])
    _revoked_while_running(processes, setup, dead_letters=[poisoned2])
    running(processes, index)
    processes.stop()
    output = processes.output()
    assert "Traceback" not in output
    assert setup.server.sasl_ssl.password not in output


def _revoked_while_running(processes: Processes, setup: Setup, dead_letters: list[str]) -> None:
    """Write taken away from both topics after the consumer published to them (its idempotent
    producer holds an id): every event still ends in the database, the refused dead letter and
    the acknowledgement given up name the ACL, nothing is retried per poll. Granted again, the
    same process publishes both again: aiokafka had numbered the refused records, and every
    later one was refused ``OutOfOrderSequenceNumber`` until a restart."""
    said = len(processes.output())
    refused = (setup.dlq, setup.acks)
    for name in refused:
        revoke(setup.server, name, WRITE)
    settle(processes, lambda: not any(may_write(setup.server, n) for n in refused), "revoked")
    ok, poisoned = setup.send("o-revoked"), setup.send("fail-revoked")
    settle(
        processes,
        lambda: setup.state(ok) == "succeeded" and setup.state(poisoned) == "dead",
        "both settled while refused",
    )
    error = (inbox_row(setup.db_url, "billing", poisoned) or {})["last_error"]
    assert error.startswith(f"dead letter could not be published to {setup.dlq!r}"), error
    # The ACL named: the topic's, or (aiokafka replaces its producer after a refusal, and no
    # Write is left on any topic) the producer id's, which names both topics.
    assert "grant the consumer's principal Write and Describe on " in error, error
    for event_id in (ok, poisoned):
        wait_output(processes, f"acknowledgement for {event_id} (", "the ack given up")
    gave_up = [line for line in processes.output()[said:].splitlines() if " given up " in line]
    assert len(gave_up) == 2, gave_up  # at once, each: no retry fixes it
    assert all("grant the consumer's principal Write and Describe on " in g for g in gave_up)

    grant(setup.server, topic(setup.dlq, WRITE), topic(setup.acks, WRITE))
    settle(processes, lambda: all(may_write(setup.server, n) for n in refused), "granted")
    # A refusal may hold for REFUSAL_PAUSE: poisoned events are sent one by one until one's
    # dead letter is published (its row then keeps the handler's own error).
    probes: list[str] = []
    for n in range(60):
        probes.append(setup.send(f"fail-probe-{n}"))
        settle(processes, lambda: setup.state(probes[-1]) == "dead", "the probe dead")
        if (inbox_row(setup.db_url, "billing", probes[-1]) or {})["last_error"].startswith(
            "RuntimeError"
        ):
            break
    else:
        raise AssertionError(f"no dead letter after the grant:\n{processes.output()}")
    settle(processes, lambda: setup.acked(0).get(probes[-1]) == "dead", "acknowledged again")
    dead = read_topic(setup.server.plaintext_bootstrap, setup.dlq, expect=2, quiet=0.5)
    assert [dict(m.headers())["dlq-event-id"].decode() for m in dead] == [
        *dead_letters,
        probes[-1],
    ]
    output = processes.output()[said:]
    assert "OutOfOrderSequenceNumber" not in output
    # Bounded: each event's own lines (a dead probe's: its dead letter refused, dead, its ack
    # given up) and a client's line per new producer refused an id; none per poll.
    noisy = [line for line in output.splitlines() if " ERROR " in line or " WARNING " in line]
    assert len(noisy) <= 6 + 3 * len(probes), output


@pytest.mark.parametrize("client", CLIENTS)
def test_read_missing_on_the_topic_waits_for_the_grant(
    client: str, setup: Setup, processes: Processes
) -> None:
    """The consumer says which ACL is missing and consumes once it is granted (aiokafka's
    refused fetch ended the process with a traceback)."""
    grant(setup.server, *without(setup.documented(), setup.topic, READ))
    ok = setup.send("o-1")
    index = start(processes, setup, client)
    settle(
        processes,
        lambda: running(processes, index) and "Kafka refused this consumer" in processes.output(),
        "the refusal said",
    )
    output = processes.output()
    assert "Read and Describe on its topics" in output
    assert setup.state(ok) is None
    grant(setup.server, topic(setup.topic, READ))
    settle(
        processes,
        lambda: running(processes, index) and setup.state(ok) == "succeeded",
        "consumed once granted",
    )
    assert [e[0] for e in effects(setup.db_url)] == [ok]
    assert setup.acked(1) == {ok: "succeeded"}
    processes.stop()
    output = processes.output()
    assert "Traceback" not in output
    assert output.count("Kafka refused this consumer") <= 3, output  # said, not once per poll
    assert output.count("Not authorized to read from topic") <= 1, output  # aiokafka's own line


def test_read_missing_on_the_group_confluent_waits_for_the_grant(
    setup: Setup, processes: Processes
) -> None:
    """librdkafka keeps asking for the group's coordinator: the member joins once granted."""
    grant(setup.server, *without(setup.documented(), setup.group, READ))
    ok = setup.send("o-1")
    index = start(processes, setup, "confluent")
    settle(
        processes,
        lambda: running(processes, index) and "Kafka refused this consumer" in processes.output(),
        "the refusal said",
    )
    assert "GROUP_AUTHORIZATION_FAILED" in processes.output()
    assert "Read on its group" in processes.output()
    assert setup.state(ok) is None
    grant(setup.server, group(setup.group, READ))
    settle(
        processes,
        lambda: running(processes, index) and setup.state(ok) == "succeeded",
        "consumed once granted",
    )
    assert setup.acked(1) == {ok: "succeeded"}
    processes.stop()
    assert "Traceback" not in processes.output()


def test_read_missing_on_the_group_aiokafka_waits_naming_it(
    setup: Setup, processes: Processes
) -> None:
    """aiokafka's start is refused at once. The process ended (a crash loop under a supervisor
    until the ACL was granted); now it says the group and the ACL, retries with back-off, and
    the same process consumes once granted."""
    grant(setup.server, *without(setup.documented(), setup.group, READ))
    ok = setup.send("o-1")
    index = start(processes, setup, "aiokafka")
    settle(
        processes,
        lambda: running(processes, index) and "retrying in" in processes.output(index),
        "the refusal said, and a retry ahead",
    )
    output = processes.output(index)
    assert f"GroupAuthorizationFailedError: {setup.group} (Kafka refused" in output, output
    assert "Read on its group" in output
    assert setup.state(ok) is None
    # A stop during the back-off ends a second such process cleanly (exit 0): no further start.
    other = start(processes, setup, "aiokafka")
    settle(processes, lambda: "retrying in" in processes.output(other), "the second one waiting")
    processes.procs[other][0].terminate()
    assert processes.procs[other][0].wait(30) == 0, processes.output(other)
    grant(setup.server, group(setup.group, READ))
    settle(
        processes,
        lambda: running(processes, index) and setup.state(ok) == "succeeded",
        "consumed once granted, by the same process",
    )
    assert setup.acked(1) == {ok: "succeeded"}
    processes.stop()
    output = processes.output()
    assert "Traceback" not in output
    assert setup.server.sasl_ssl.password not in output


@pytest.mark.parametrize("client", CLIENTS)
def test_read_revoked_while_running_then_granted_again(
    client: str, setup: Setup, processes: Processes
) -> None:
    """An operator takes Read on the topic away from a consumer that is consuming: it says so,
    does not end, and once Read is granted again the same process handles every event sent
    meanwhile, each once."""
    grant(setup.server, *setup.documented())
    first = setup.send("o-1")
    index = start(processes, setup, client)
    settle(processes, lambda: setup.state(first) == "succeeded", "consuming")

    revoke(setup.server, setup.topic, READ)
    settle(
        processes,
        lambda: running(processes, index) and "Kafka refused this consumer" in processes.output(),
        "the refusal said",
    )
    assert "Read and Describe on its topics" in processes.output()
    meanwhile = [setup.send(f"o-{n}") for n in range(2, 5)]
    grant(setup.server, topic(setup.topic, READ))
    settle(
        processes,
        lambda: running(processes, index) and all(setup.state(e) == "succeeded" for e in meanwhile),
        "consumed again once granted",
    )
    assert sorted(e[0] for e in effects(setup.db_url)) == sorted([first, *meanwhile])
    acked = setup.acked(4)
    assert acked == dict.fromkeys([first, *meanwhile], "succeeded"), acked
    processes.stop()
    output = processes.output()
    assert "Traceback" not in output
    assert output.count("Kafka refused this consumer") <= 3, output  # said, not once per poll
    # aiokafka's own line came per partition and fetch, twice a second while refused.
    assert output.count("Not authorized to read from topic") <= 1, output
    assert setup.server.sasl_ssl.password not in output
