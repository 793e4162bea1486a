"""The relay (``outboxkit relay run``) against a broker with Kafka's ACL authorizer.

docs/security.md ("Kafka ACLs per principal") lists the ACLs the relay's principal needs. Here a
real relay process, over each Kafka client, runs with exactly those ACLs (the checkpoint topic
created beforehand, as the docs allow), then with one of them missing: what it says, that it
neither stalls, spins nor loses a row, and that it carries on once the ACL is granted, without
a restart; also Write taken away from a topic while the relay publishes to it. The broker is
this module's own (SASL_SSL, SCRAM, StandardAuthorizer); its loopback PLAINTEXT listener (a
super user) is the test's alone: topics, ACLs, reading records back.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclOperation,
    ResourceType,
)
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from outboxkit import Message, Outbox
from outboxkit.devstack import KafkaServer
from outboxkit.devstack.aio import run_coroutine
from outboxkit.kafka import KafkaClients
from outboxkit.kafka.errors import TOPIC_WRITE_HINT, TRANSACTIONAL_ID_ACL_HINT
from outboxkit.relay.checkpoint import CHECKPOINT_TOPIC_CONFIG
from outboxkit.settings import KafkaSettings
from tests.fault.test_secured_kafka import OUTBOXKIT, ROOT, Processes
from tests.support.brokers import own_broker
from tests.support.kafka_acls import (
    Acl,
    grant,
    may_write,
    revoke,
    revoke_all,
    topic,
    transactional_id,
)
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

CLIENTS = [pytest.param("confluent", id="confluent"), pytest.param("aiokafka", id="aiokafka")]
WRITE, DESCRIBE, READ = AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.READ
DESCRIBE_CONFIGS = AclOperation.DESCRIBE_CONFIGS
NO_DESCRIBE_CONFIGS = "needs DescribeConfigs on the topic"


@pytest.fixture(scope="module")
def acl_kafka() -> Iterator[KafkaServer]:
    """A SASL_SSL broker whose SCRAM user may do only what a test grants (~4 s to start)."""
    yield from own_broker(security="sasl_ssl", authorizer=True)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path)
    yield running
    running.stop()


class Relay:
    """One relay test's names: its group, topics and checkpoint topic (ACLs are per name)."""

    def __init__(self, server: KafkaServer, db_url: str, client: str) -> None:
        self.server, self.db_url, self.client = server, db_url, client
        suffix = uuid.uuid4().hex[:8]
        self.group = f"g{suffix}"
        self.checkpoint = f"ckpt-{suffix}"
        self.suffix = suffix
        revoke_all(server)  # nothing left over from an earlier test

    def topic_name(self, name: str) -> str:
        return f"{name}-{self.suffix}"

    def create(self, *names: str, checkpoint: bool = True) -> None:
        """Topics of one partition (and the compacted checkpoint topic), as a super user."""
        settings = KafkaSettings.plaintext(self.server.plaintext_bootstrap)

        async def create() -> None:
            admin = KafkaClients(settings, timeout=60.0).admin()
            try:
                for name in names:
                    await admin.create_topic(name, 1, {}, replication_factor=1)
                if checkpoint:
                    config = dict(CHECKPOINT_TOPIC_CONFIG)
                    await admin.create_topic(self.checkpoint, 1, config, replication_factor=1)
            finally:
                await admin.close()

        run_coroutine(create())

    def documented(
        self, *topics: str, describe_configs: bool = True, exactly_once: bool = True
    ) -> list[Acl]:
        """The docs table's ACLs for a relay publishing to ``topics``."""
        operations = (WRITE, DESCRIBE, *((DESCRIBE_CONFIGS,) if describe_configs else ()))
        acls = [topic(name, *operations) for name in topics]
        if exactly_once:
            acls += [topic(self.checkpoint, READ, WRITE, DESCRIBE), self.transactional_ids()]
        return acls

    def transactional_ids(self) -> Acl:
        return transactional_id(f"outboxkit-relay.{self.group}.", WRITE, DESCRIBE, prefixed=True)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
        env.update(self.server.sasl_ssl.env())
        env.update(
            OUTBOXKIT_DATABASE_URL=self.db_url,
            OUTBOXKIT_KAFKA_CLIENT=self.client,
            OUTBOXKIT_RELAY_GROUP=self.group,
            OUTBOXKIT_RELAY_CHECKPOINT_TOPIC=self.checkpoint,
            OUTBOXKIT_RELAY_POLL_INTERVAL="0.2",
            OUTBOXKIT_RELAY_KAFKA_TIMEOUT="10",
            OUTBOXKIT_RELAY_BACKOFF_MAX="2",
            PYTHONPATH=str(ROOT),
            **extra,
        )
        return env

    def outbox(self, sa_url: str, rows: list[tuple[str, str, int]]) -> list[int]:
        """Write rows (topic, key, n); their ids."""
        engine = create_engine(sa_url)
        try:
            with Session(engine) as session, session.begin():
                messages = [Message(topic=t, payload={"n": n}, key=k) for t, k, n in rows]
                ids = [r.id for r in Outbox().add_many(session, messages) if r.id is not None]
            assert len(ids) == len(rows)  # no duplicate: every row is new
            return ids
        finally:
            engine.dispose()

    def states(self) -> dict[int, tuple[str, str | None]]:
        with psycopg.connect(self.db_url) as conn:
            rows = conn.execute(
                "SELECT id, state, parked_reason FROM outboxkit.outbox_message"
            ).fetchall()
        return {row[0]: (row[1], row[2]) for row in rows}


def _published(relay: Relay, ids: list[int]) -> bool:
    states = relay.states()
    return all(states[i][0] == "published" for i in ids)


def _values(server: KafkaServer, name: str, expect: int) -> list[tuple[str, int]]:
    records = read_topic(server.plaintext_bootstrap, name, expect=expect, quiet=0.5)
    return [(m.key().decode(), json.loads(m.value())["n"]) for m in records]


def _wait(
    processes: Processes, predicate: Callable[[], object], what: str, timeout: float = 60
) -> None:
    try:
        wait_for(predicate, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; output:\n{processes.output()}") from None


@pytest.mark.parametrize("client", CLIENTS)
def test_exactly_once_with_the_documented_acls_then_one_missing(
    client: str,
    acl_kafka: KafkaServer,
    outboxkit_db_url: str,
    sa_url: str,
    processes: Processes,
) -> None:
    """The takeover reads the checkpoints back: with confluent-kafka that read's throwaway
    consumer group asked for a group ACL the docs do not list, and the shard never published."""
    relay = Relay(acl_kafka, outboxkit_db_url, client)
    orders, refunds, audit = (relay.topic_name(n) for n in ("orders", "refunds", "audit"))
    relay.create(orders, refunds, audit)
    grant(acl_kafka, *relay.documented(orders, refunds))
    rows = [(t, f"k{n % 3}", n) for n in range(12) for t in (orders, refunds)]
    first = relay.outbox(sa_url, rows)
    processes.start(["relay", "run"], relay.env())
    _wait(processes, lambda: _published(relay, first), "every row published")
    for name in (orders, refunds):
        got = _values(acl_kafka, name, 12)
        assert sorted(got) == sorted((f"k{n % 3}", n) for n in range(12))  # once each
        for key in ("k0", "k1", "k2"):
            mine = [n for k, n in got if k == key]
            assert mine == sorted(mine)  # in order per key
    assert NO_DESCRIBE_CONFIGS not in processes.output()

    # DescribeConfigs missing on one topic: said once, naming the ACL and topic; still published.
    grant(acl_kafka, topic(audit, WRITE, DESCRIBE))
    more = relay.outbox(sa_url, [(audit, "a", n) for n in range(3)])
    _wait(processes, lambda: _published(relay, more), "rows of the topic without DescribeConfigs")
    again = relay.outbox(sa_url, [(audit, "a", n) for n in range(3, 6)])
    _wait(processes, lambda: _published(relay, again), "more rows of that topic")
    output = processes.output()
    warnings = [line for line in output.splitlines() if NO_DESCRIBE_CONFIGS in line]
    assert len(warnings) == 1, output
    assert repr(audit) in warnings[0]
    assert [n for _, n in _values(acl_kafka, audit, 6)] == list(range(6))
    assert "Traceback" not in output
    assert acl_kafka.sasl_ssl.password not in output

    # A takeover without Read on the checkpoint topic (it holds checkpoints now): said, naming
    # the topic; nothing is published until it can read them, then everything.
    processes.stop()
    revoke_all(acl_kafka)
    acls = relay.documented(orders, refunds)
    acls.remove(topic(relay.checkpoint, READ, WRITE, DESCRIBE))
    acls.append(topic(relay.checkpoint, WRITE, DESCRIBE))
    grant(acl_kafka, *acls)
    last = relay.outbox(sa_url, [(orders, "k0", n) for n in range(12, 15)])
    index = processes.start(["relay", "run"], relay.env())

    needs_read = f"needs Read on the checkpoint topic {relay.checkpoint!r}"

    def refused_read() -> bool:
        lines = processes.output(index).splitlines()
        return any(needs_read in line and "retrying in" in line for line in lines)

    _wait(processes, refused_read, "the refused checkpoint read, naming the ACL and topic")
    assert all(relay.states()[i][0] == "pending" for i in last)
    grant(acl_kafka, topic(relay.checkpoint, READ))
    _wait(processes, lambda: _published(relay, last), "the rows after the takeover published")
    assert processes.procs[index][0].poll() is None
    assert [n for k, n in _values(acl_kafka, orders, 15) if k == "k0"][-3:] == [12, 13, 14]


def _wait_writable(processes: Processes, server: KafkaServer, name: str) -> None:
    """Until the broker tells the relay's principal it may write to ``name`` (a grant is
    applied asynchronously: a claim right after it may still be refused)."""
    _wait(processes, lambda: may_write(server, name) is True, f"Write on {name} effective")


def _revoke_write(processes: Processes, server: KafkaServer, name: str) -> None:
    """Take Write on topic ``name`` away from the relay's principal, until the broker says so."""
    revoke(server, name, WRITE)
    _wait(processes, lambda: may_write(server, name) is False, f"Write on {name} revoked")


def _outbox_cli(relay: Relay, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
    env.update(OUTBOXKIT_DATABASE_URL=relay.db_url, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [OUTBOXKIT, "outbox", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _parked_behind_its_key(
    processes: Processes, relay: Relay, blocked: str, blocked_ids: list[int], open_ids: list[int]
) -> None:
    """The other topic's rows published; the refused topic's first row parked naming the
    refusal, the rows behind it (its key) still to publish: none went out."""
    _wait(processes, lambda: _published(relay, open_ids), "the other topic's rows published")
    _wait(
        processes,
        lambda: relay.states()[blocked_ids[0]][0] == "parked",
        "the refused topic's first row parked",
    )
    states = relay.states()
    reason = states[blocked_ids[0]][1] or ""
    assert "AUTHORIZATION" in reason.upper(), reason
    assert TOPIC_WRITE_HINT in reason, reason  # both modes say what to grant
    assert f"parked row {blocked_ids[0]} (topic {blocked})" in processes.output()
    # Still to publish: pending, or held behind the parked row once the holder's pass ran.
    assert {states[i][0] for i in blocked_ids[1:]} <= {"pending", "held"}, states


def _granted_and_retried(
    processes: Processes, relay: Relay, blocked: str, blocked_ids: list[int]
) -> None:
    grant(relay.server, topic(blocked, WRITE))
    _wait_writable(processes, relay.server, blocked)  # KRaft applies ACLs asynchronously
    _outbox_cli(relay, "retry", "--all")
    _wait(processes, lambda: _published(relay, blocked_ids), "the retried rows published")


def _nothing_leaked(processes: Processes, server: KafkaServer) -> None:
    output = processes.output()
    assert "Traceback" not in output
    assert server.sasl_ssl.password not in output


@pytest.mark.parametrize("mode", ["exactly_once", "at_least_once"])
@pytest.mark.parametrize("client", CLIENTS)
def test_write_missing_on_one_topic_parks_its_rows_until_granted_and_retried(
    client: str,
    mode: str,
    acl_kafka: KafkaServer,
    outboxkit_db_url: str,
    sa_url: str,
    processes: Processes,
) -> None:
    relay = Relay(acl_kafka, outboxkit_db_url, client)
    blocked, open_ = relay.topic_name("blocked"), relay.topic_name("open")
    exactly_once = mode == "exactly_once"
    relay.create(blocked, open_, checkpoint=exactly_once)
    acls = relay.documented(open_, exactly_once=exactly_once)
    acls.append(topic(blocked, DESCRIBE, DESCRIBE_CONFIGS))  # every documented ACL but Write
    grant(acl_kafka, *acls)
    rows = [(t, f"k-{t}", n) for n in range(4) for t in (blocked, open_)]
    ids = relay.outbox(sa_url, rows)
    blocked_ids = [i for i, row in zip(ids, rows, strict=True) if row[0] == blocked]
    open_ids = [i for i, row in zip(ids, rows, strict=True) if row[0] == open_]
    processes.start(["relay", "run"], relay.env(OUTBOXKIT_RELAY_MODE=mode))

    _parked_behind_its_key(processes, relay, blocked, blocked_ids, open_ids)

    # at_least_once: rows acknowledged in the batch the broker refused go again (duplicates).
    def once(got: list[int]) -> list[int]:
        return got if exactly_once else list(dict.fromkeys(got))

    assert once([n for _, n in _values(acl_kafka, open_, 4)]) == list(range(4))

    _granted_and_retried(processes, relay, blocked, blocked_ids)
    assert once([n for _, n in _values(acl_kafka, blocked, 4)]) == list(range(4))
    _nothing_leaked(processes, acl_kafka)


@pytest.mark.parametrize("mode", ["exactly_once", "at_least_once"])
@pytest.mark.parametrize("client", CLIENTS)
def test_write_revoked_while_running_parks_that_topic_only_until_granted_and_retried(
    client: str,
    mode: str,
    acl_kafka: KafkaServer,
    outboxkit_db_url: str,
    sa_url: str,
    processes: Processes,
) -> None:
    """An operator takes Write away from a topic the relay already published to: its new rows
    are parked naming the refusal, not retried for ever nor marked published; the other topic
    flows on, in order; once granted again, ``outbox retry`` delivers them, once each."""
    relay = Relay(acl_kafka, outboxkit_db_url, client)
    blocked, open_ = relay.topic_name("blocked"), relay.topic_name("open")
    exactly_once = mode == "exactly_once"
    relay.create(blocked, open_, checkpoint=exactly_once)
    grant(acl_kafka, *relay.documented(blocked, open_, exactly_once=exactly_once))
    first = relay.outbox(sa_url, [(t, f"k-{t}", n) for n in range(3) for t in (blocked, open_)])
    index = processes.start(["relay", "run"], relay.env(OUTBOXKIT_RELAY_MODE=mode))
    proc = processes.procs[index][0]
    _wait(processes, lambda: _published(relay, first), "both topics flowing")

    _revoke_write(processes, acl_kafka, blocked)
    rows = [(t, f"k-{t}", n) for n in range(3, 7) for t in (blocked, open_)]
    ids = relay.outbox(sa_url, rows)
    blocked_ids = [i for i, row in zip(ids, rows, strict=True) if row[0] == blocked]
    open_ids = [i for i, row in zip(ids, rows, strict=True) if row[0] == open_]
    _parked_behind_its_key(processes, relay, blocked, blocked_ids, open_ids)

    # at_least_once: rows acknowledged in the batch the broker refused go again (duplicates).
    def once(got: list[int]) -> list[int]:
        return got if exactly_once else list(dict.fromkeys(got))

    assert once([n for _, n in _values(acl_kafka, open_, 7)]) == list(range(7))  # in order
    assert proc.poll() is None

    _granted_and_retried(processes, relay, blocked, blocked_ids)
    assert once([n for _, n in _values(acl_kafka, blocked, 7)]) == list(range(7))
    assert proc.poll() is None  # the same process throughout
    _nothing_leaked(processes, acl_kafka)


@pytest.mark.parametrize("client", CLIENTS)
def test_checkpoint_write_missing_is_named_then_publishes_once_granted(
    client: str,
    acl_kafka: KafkaServer,
    outboxkit_db_url: str,
    sa_url: str,
    processes: Processes,
) -> None:
    """Without Write on the checkpoint topic confluent-kafka purged every transaction whole
    (``_PURGE_QUEUE``, retriable): every shard retried for ever, nothing named the ACL."""
    relay = Relay(acl_kafka, outboxkit_db_url, client)
    orders = relay.topic_name("orders")
    relay.create(orders)
    acls = relay.documented(orders)
    acls.remove(topic(relay.checkpoint, READ, WRITE, DESCRIBE))
    acls.append(topic(relay.checkpoint, READ, DESCRIBE))
    grant(acl_kafka, *acls)
    ids = relay.outbox(sa_url, [(orders, "k", n) for n in range(3)])
    index = processes.start(["relay", "run"], relay.env())
    proc = processes.procs[index][0]

    def named() -> bool:
        lines = processes.output(index).splitlines()
        return any(
            repr(relay.checkpoint) in line and "grant it Write" in line and "retr" in line
            for line in lines
        )

    _wait(processes, named, "the missing Write on the checkpoint topic named")
    assert all(relay.states()[i][0] == "pending" for i in ids)
    grant(acl_kafka, topic(relay.checkpoint, WRITE))
    _wait(processes, lambda: _published(relay, ids), "every row published once granted")
    assert proc.poll() is None  # the same process: no restart
    assert [n for _, n in _values(acl_kafka, orders, 3)] == list(range(3))
    _nothing_leaked(processes, acl_kafka)


_SHARD_RETRYING = re.compile(r"shard (\d+): .* retrying in (\d+\.\d+)s")


@pytest.mark.parametrize("client", CLIENTS)
def test_transactional_id_acl_missing_backs_off_then_publishes_once_granted(
    client: str,
    acl_kafka: KafkaServer,
    outboxkit_db_url: str,
    sa_url: str,
    processes: Processes,
) -> None:
    relay = Relay(acl_kafka, outboxkit_db_url, client)
    orders = relay.topic_name("orders")
    relay.create(orders)
    acls = relay.documented(orders)
    acls.remove(relay.transactional_ids())
    grant(acl_kafka, *acls)
    ids = relay.outbox(sa_url, [(orders, "k", n) for n in range(5)])
    index = processes.start(["relay", "run"], relay.env(OUTBOXKIT_RELAY_BACKOFF_INITIAL="0.2"))
    proc = processes.procs[index][0]

    def refusals() -> dict[str, list[float]]:
        """Each shard's back-off delays after a refusal naming the ACL, in order."""
        found: dict[str, list[float]] = {}
        for line in processes.output().splitlines():
            m = _SHARD_RETRYING.search(line)
            if TRANSACTIONAL_ID_ACL_HINT in line and m:
                found.setdefault(m.group(1), []).append(float(m.group(2)))
        return found

    # Backs off, growing towards backoff_max (2 s): no spin, no exit. Each shard's delays double
    # from backoff_initial (0.2 s), drawn from [base/2, base]: its 5th is at least 1 s (base 2 s).
    _wait(
        processes,
        lambda: any(d >= 1.0 for ds in refusals().values() for d in ds),
        "a back-off of a second or more",
    )
    for shard, delays in refusals().items():
        reached = [i for i, d in enumerate(delays) if d >= 1.0]
        assert len(delays[: reached[0] if reached else None]) <= 4, (shard, delays)
    assert proc.poll() is None
    assert all(relay.states()[i][0] == "pending" for i in ids)

    grant(acl_kafka, relay.transactional_ids())
    _wait(processes, lambda: _published(relay, ids), "every row published once granted")
    assert proc.poll() is None  # the same process: no restart
    assert [n for _, n in _values(acl_kafka, orders, 5)] == list(range(5))
    _nothing_leaked(processes, acl_kafka)


CLUSTER_DESCRIBE_CONFIGS = Acl(ResourceType.BROKER, "kafka-cluster", (DESCRIBE_CONFIGS,))


@pytest.mark.parametrize("client", CLIENTS)
def test_first_start_creates_the_checkpoint_topic(
    client: str,
    acl_kafka: KafkaServer,
    outboxkit_db_url: str,
    sa_url: str,
    processes: Processes,
) -> None:
    """No checkpoint topic yet, ``Create`` on it instead (the docs' first-start row). aiokafka
    cannot ask the broker for its default replication (CreateTopics v3) and must read it: without
    DescribeConfigs on the Cluster it says so and waits, instead of making the topic with one
    replica whatever the cluster's default."""
    relay = Relay(acl_kafka, outboxkit_db_url, client)
    orders = relay.topic_name("orders")
    relay.create(orders, checkpoint=False)
    acls = relay.documented(orders)
    acls.append(topic(relay.checkpoint, AclOperation.CREATE))
    grant(acl_kafka, *acls)
    ids = relay.outbox(sa_url, [(orders, "k", n) for n in range(3)])
    index = processes.start(["relay", "run"], relay.env())
    proc = processes.procs[index][0]
    if client == "aiokafka":
        hint = "grant the principal DescribeConfigs on the Cluster, or create the topic beforehand"
        _wait(processes, lambda: hint in processes.output(), "the missing cluster ACL named")
        assert repr(relay.checkpoint) in processes.output()
        assert _topic_config(acl_kafka, relay.checkpoint) is None  # not made with a guess
        assert all(relay.states()[i][0] == "pending" for i in ids)
        grant(acl_kafka, CLUSTER_DESCRIBE_CONFIGS)
    _wait(processes, lambda: _published(relay, ids), "every row published")
    assert proc.poll() is None
    assert _topic_config(acl_kafka, relay.checkpoint) == "compact"
    assert [n for _, n in _values(acl_kafka, orders, 3)] == list(range(3))
    assert "Traceback" not in processes.output()


def _topic_config(server: KafkaServer, name: str) -> str | None:
    """The topic's cleanup.policy; None if it does not exist."""
    settings = KafkaSettings.plaintext(server.plaintext_bootstrap)

    async def read() -> str | None:
        admin = KafkaClients(settings, timeout=30.0).admin()
        try:
            if await admin.describe_topic(name) is None:
                return None
            return await admin.topic_config(name, "cleanup.policy")
        finally:
            await admin.close()

    return run_coroutine(read())


def test_the_verify_read_back_needs_no_group_acl(acl_kafka: KafkaServer) -> None:
    """``outboxkit verify`` reads the relay's topics back by assignment, under a consumer group
    librdkafka insists on but the read never joins: Read on the topics is all it needs."""
    from outboxkit.kafka.confluent_readback import read_to_end

    relay = Relay(acl_kafka, "", "confluent")
    name = relay.topic_name("verify")
    relay.create(name, checkpoint=False)
    plain = KafkaSettings.plaintext(acl_kafka.plaintext_bootstrap)
    sender = KafkaClients(plain, timeout=30.0).record_sender()
    try:
        sender.send(name, b"k", b"v", [])
    finally:
        sender.close()
    grant(acl_kafka, topic(name, READ, DESCRIBE))

    records = read_to_end(acl_kafka.sasl_ssl.kafka_settings(), [(name, 0)], timeout=60.0)

    assert [(r.key, r.value) for r in records] == [(b"k", b"v")]
