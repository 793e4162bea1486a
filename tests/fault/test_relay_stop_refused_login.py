"""SIGTERM while Kafka refuses the relay's login: the relay stops at once and hands over its lease.

A call that cannot succeed because the broker refuses the login (a wrong password, an expired
token) answers only when its timeout ends: the checkpoint topic's metadata at start-up, and the
producer's ``init_transactions`` once the relay holds a lease. The relay used to wait for that
answer before it stopped, holding the lease all along, so a standby could not take over. Here the
Kafka timeout is the longest allowed (300 s), far beyond the wait for the exit: a relay that waits
for the call does not exit in time. The broker is the session's SASL_SSL Kafka; the relay of the
lease test logs in as a user of its own, whose credentials the test deletes. Last, a claim's
topic check (its metadata, at most 10 s) with no broker there at all, at-least-once.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from outboxkit import Outbox
from outboxkit.db import sqlalchemy_url
from outboxkit.devstack import KafkaServer
from outboxkit.devstack.process import free_port
from tests.fault.test_secured_kafka import ROOT, Processes, _env, _message
from tests.relay_support import set_shard_count
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

HANG_GUARD = 120.0  # seconds; far below the Kafka timeout, far above a stop that does not wait
NEVER_ANSWERS = {"OUTBOXKIT_RELAY_KAFKA_TIMEOUT": "300"}


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path)
    yield running
    running.stop()


def _scram(server: KafkaServer, change: Any) -> None:
    """Create or delete a SCRAM user (over the unauthenticated loopback listener)."""
    admin = AdminClient({"bootstrap.servers": server.plaintext_bootstrap})
    for future in admin.alter_user_scram_credentials([change]).values():
        future.result(60)


def _user_gone(server: KafkaServer, user: str) -> bool:
    """Whether the broker no longer knows the user's credentials (its login is refused)."""
    admin = AdminClient({"bootstrap.servers": server.plaintext_bootstrap})
    try:
        found: Any = admin.describe_user_scram_credentials([user])
        found[user].result(60)
    except KafkaException:
        return True  # RESOURCE_NOT_FOUND
    return False


def _lease(db_url: str) -> tuple[str | None, bool]:
    """Shard 0's holder and whether its lease is still running."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT holder, expires_at > now() FROM outboxkit.relay_lease"
            " WHERE relay_group = 'default' AND shard = 0"
        ).fetchone()
    assert row is not None
    return row[0], bool(row[1])


def _stopped(processes: Processes, index: int) -> int:
    """SIGTERM, then the exit code (the hang guard fails a relay that waits for Kafka)."""
    proc, _ = processes.procs[index]
    proc.terminate()
    return proc.wait(HANG_GUARD)


def _healthz_answers(port: int) -> Callable[[], bool]:
    import urllib.error
    import urllib.request

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                return True
        except urllib.error.HTTPError:
            return True  # 503: not healthy, but serving
        except OSError:
            return False

    return answers


def test_sigterm_at_start_up_while_kafka_refuses_the_login_exits(
    outboxkit_secure_kafka: KafkaServer, outboxkit_db_url: str, processes: Processes
) -> None:
    port = free_port()
    env = _env(
        outboxkit_db_url,
        outboxkit_secure_kafka,
        "confluent",
        OUTBOXKIT_KAFKA_SASL_PASSWORD=f"wrong-{uuid.uuid4().hex}",
        OUTBOXKIT_RELAY_METRICS_PORT=str(port),
        **NEVER_ANSWERS,
    )
    index = processes.start(["relay", "run"], env)
    # The endpoint serves once the start-up runs (the signal handlers are in place before it):
    # the checkpoint topic's metadata is asked for from then on, and never answered.
    wait_for(_healthz_answers(port), timeout=60, what=f"the relay's start-up; {processes.output()}")
    assert _stopped(processes, index) == 0, processes.output(index)
    assert "Traceback" not in processes.output(index)


@pytest.fixture
def relay_user(outboxkit_secure_kafka: KafkaServer) -> tuple[str, str]:
    """A SCRAM user of this test's own (the session's user stays untouched): name, password."""
    user, password = f"relay-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    _scram(outboxkit_secure_kafka, UserScramCredentialUpsertion(user, info, password.encode()))
    return user, password


def test_sigterm_while_the_producer_cannot_log_in_releases_the_lease_at_once(
    outboxkit_secure_kafka: KafkaServer,
    outboxkit_db_url: str,
    processes: Processes,
    relay_user: tuple[str, str],
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        # Another holder keeps the lease until the login is refused: then the relay takes it.
        conn.execute(
            "INSERT INTO outboxkit.relay_lease (relay_group, shard, holder, token, expires_at)"
            " VALUES ('default', 0, 'another-relay',"
            " nextval('outboxkit.relay_fencing_token_seq'), now() + interval '1 hour')"
        )
    user, password = relay_user
    env = _env(
        outboxkit_db_url,
        outboxkit_secure_kafka,
        "confluent",
        OUTBOXKIT_KAFKA_SASL_USERNAME=user,
        OUTBOXKIT_KAFKA_SASL_PASSWORD=password,
        OUTBOXKIT_RELAY_CHECKPOINT_TOPIC=f"outboxkit.cp.{uuid.uuid4().hex[:8]}",
        **NEVER_ANSWERS,
    )
    index = processes.start(["relay", "run"], env)
    wait_for(
        lambda: "starting: shards" in processes.output(index),
        timeout=120,
        what=f"the relay past its start-up; {processes.output(index)}",
    )
    _scram(outboxkit_secure_kafka, UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512))
    wait_for(lambda: _user_gone(outboxkit_secure_kafka, user), timeout=60, what="user deleted")
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute("UPDATE outboxkit.relay_lease SET holder = NULL, expires_at = now()")
    # Logged in the step that goes on to start the producer: a SIGTERM handled after it finds
    # the producer starting, and its login refused.
    wait_for(
        lambda: "shard 0 active with token" in processes.output(index),
        timeout=60,
        what=f"the relay holding the lease; {processes.output(index)}",
    )
    assert _lease(outboxkit_db_url)[0] is not None
    assert _stopped(processes, index) == 0, processes.output(index)
    assert _lease(outboxkit_db_url) == (None, False)  # released: a standby takes over at once
    assert "released lease of shard 0" in processes.output(index)


def _leases_held(db_url: str) -> int:
    """How many shards' leases are still held (a holder and a time left)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM outboxkit.relay_lease"
            " WHERE holder IS NOT NULL AND expires_at > now()"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("shards", [1, 8])
def test_sigterm_during_a_topic_check_with_kafka_away_releases_the_lease_at_once(
    outboxkit_db_url: str, processes: Processes, shards: int
) -> None:
    """A claim's new topic is asked about (its metadata) before anything is sent; with no broker
    there, librdkafka answers only when the question's timeout (10 s) ends. The relay used to
    wait for it before it stopped, holding its leases. The SIGTERM comes once every shard said
    it asks (``-vv``); with eight shards the questions' threads outnumber the default executor's
    on two cores, which a close and the exit then queued behind."""
    set_shard_count(outboxkit_db_url, shards)
    engine = create_engine(sqlalchemy_url(outboxkit_db_url))
    with Session(engine) as session, session.begin():  # 128 keys: rows in every shard
        Outbox().add_many(session, [_message("orders", f"o-{n}", n) for n in range(128)])
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
    env.update(
        OUTBOXKIT_DATABASE_URL=outboxkit_db_url,
        OUTBOXKIT_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}",  # nothing listens there
        OUTBOXKIT_KAFKA_CLIENT="confluent",  # its at-least-once producer starts without Kafka
        OUTBOXKIT_RELAY_MODE="at_least_once",
        OUTBOXKIT_RELAY_POLL_INTERVAL="0.2",
        PYTHONPATH=str(ROOT),
        **NEVER_ANSWERS,
    )
    index = processes.start(["-vv", "relay", "run"], env)
    proc = processes.procs[index][0]

    def asking() -> set[str]:
        return set(re.findall(r"shard (\d+): asking Kafka about topic", processes.output(index)))

    wait_for(lambda: len(asking()) == shards, timeout=60, what="every shard asking Kafka")
    assert _leases_held(outboxkit_db_url) == shards
    proc.terminate()
    started = time.monotonic()
    wait_for(lambda: _leases_held(outboxkit_db_url) == 0, timeout=HANG_GUARD, what="released")
    released = time.monotonic() - started
    code = proc.wait(HANG_GUARD)
    exited = time.monotonic() - started
    assert code == 0, processes.output(index)
    # A question alone takes 10 s to fail: a relay that waited for it (or whose close waited
    # behind its thread) could not be this quick.
    assert released < 6, f"leases released after {released:.1f}s"
    assert exited < 6, f"exited after {exited:.1f}s"
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        states = conn.execute("SELECT DISTINCT state FROM outboxkit.outbox_message").fetchall()
    assert states == [("pending",)]  # neither parked nor marked: the next owner sends them
    assert "Traceback" not in processes.output(index)
