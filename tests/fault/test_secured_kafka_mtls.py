"""Mutual TLS on a real broker: an SSL listener with ``ssl.client.auth=required``, reached with a
client certificate and an encrypted (PKCS#8) key, from ``OUTBOXKIT_KAFKA_*`` variables alone.

The relay (exactly-once: transactional producer, checkpoint reader, admin) and a consumer with
dead letters and acknowledgements (consumer, dead-letter and acks producers, admin) run as
processes over each Kafka client. Then what a user gets wrong: a wrong key password, an
encrypted key without one, no client certificate at all (and how few librdkafka lines a
refused client logs meanwhile). The broker is this module's own (the dev stack's
``security="ssl"``); its loopback PLAINTEXT listener is for the test's set-up only.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import pty
import select
import subprocess
import termios
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outboxkit import log_limit
from outboxkit.devstack import KafkaServer
from outboxkit.errors import PublishError
from outboxkit.kafka.aiokafka_admin import AiokafkaAdmin
from outboxkit.kafka.aiokafka_consumer import AiokafkaGroupConsumer
from outboxkit.kafka.aiokafka_producer import AiokafkaTransactionalProducer
from outboxkit.kafka.aiokafka_sender import AiokafkaRecordSender
from outboxkit.kafka.config import CLIENT_CERTIFICATE_HINT, LIBRDKAFKA_LOGGER
from outboxkit.kafka.confluent_consumer import ConfluentGroupConsumer
from outboxkit.settings import KafkaSettings
from tests.fault.test_secured_kafka import (
    CLIENTS,
    OUTBOXKIT,
    ROOT,
    Processes,
    _create_topics,
    seed_payments,
)
from tests.integration.inbox_support import effects, inbox_row
from tests.support.brokers import own_broker
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

_KEY_PASSWORD = "OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD"
_CLIENT_FILES = ("OUTBOXKIT_KAFKA_SSL_CERTIFICATE_LOCATION", "OUTBOXKIT_KAFKA_SSL_KEY_LOCATION")


@pytest.fixture(scope="module")
def mtls_kafka() -> Iterator[KafkaServer]:
    yield from own_broker(security="ssl")


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path)
    yield running
    running.stop()


def _env(db_url: str, server: KafkaServer, client: str, *drop: str, **extra: str) -> dict[str, str]:
    """Variables only: the encrypted client key and its password, less ``drop``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
    env.update(server.mtls(encrypted_key=True).env())
    env.update(
        OUTBOXKIT_DATABASE_URL=db_url,
        OUTBOXKIT_KAFKA_CLIENT=client,
        OUTBOXKIT_RELAY_POLL_INTERVAL="0.2",
        # A refusal is reported when the first Kafka call gives up, 30 s by default.
        OUTBOXKIT_RELAY_KAFKA_TIMEOUT="5",
        PYTHONPATH=str(ROOT),
        **extra,
    )
    for name in drop:
        del env[name]
    return env


def _no_secret_shown(output: str, server: KafkaServer, *more: str) -> None:
    password = server.mtls(encrypted_key=True).key_password
    assert password
    for secret in (password, *more):
        assert secret not in output
    assert "Traceback" not in output


@pytest.mark.parametrize("client", CLIENTS)
def test_relay_and_consumer_over_mutual_tls_with_an_encrypted_key(
    client: str,
    mtls_kafka: KafkaServer,
    outboxkit_db_url: str,
    sa_url: str,
    processes: Processes,
) -> None:
    server = mtls_kafka
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    acks = f"{topic}.acks"
    _create_topics(server, topic, f"{topic}.dlq", acks)
    ok_ids, dead_id = seed_payments(outboxkit_db_url, sa_url, topic)
    env = _env(
        outboxkit_db_url,
        server,
        client,
        OUTBOXKIT_CONSUMER_NAME="billing",
        OUTBOXKIT_CONSUMER_GROUP=f"g-{uuid.uuid4().hex[:8]}",
        OUTBOXKIT_CONSUMER_TOPICS=topic,
        OUTBOXKIT_CONSUMER_ACKS_TOPIC=acks,
        OUTBOXKIT_CONSUMER_MAX_ATTEMPTS="2",
        OUTBOXKIT_CONSUMER_RETRY_DELAY="0.1",
    )
    assert env["OUTBOXKIT_KAFKA_SECURITY_PROTOCOL"] == "SSL"
    assert env[_KEY_PASSWORD]
    registry = "SYNC" if client == "confluent" else "ASYNC"
    processes.start(["relay", "run"], env)
    processes.start(["inbox", "run", "--registry", f"tests.fault.consumer_app:{registry}"], env)

    def settled() -> bool:
        done = [inbox_row(outboxkit_db_url, "billing", e) or {} for e in [*ok_ids, dead_id]]
        return all(row.get("state") in ("succeeded", "dead") for row in done)

    try:
        wait_for(settled, timeout=120, what="every event settled")
    except AssertionError as exc:  # the processes' output as it is then
        raise AssertionError(f"{exc}; output:\n{processes.output()}") from None
    assert sorted(e[0] for e in effects(outboxkit_db_url) if e[0] in ok_ids) == sorted(ok_ids)
    plain = server.plaintext_bootstrap
    assert len(read_topic(plain, topic, expect=6, quiet=1.0)) == 6  # exactly once into Kafka
    dead_letters = read_topic(plain, f"{topic}.dlq", expect=1, quiet=0.5)
    assert [dict(m.headers())["dlq-event-id"].decode() for m in dead_letters] == [dead_id]
    acked = {
        body["event_id"]: body["state"]
        for body in (json.loads(m.value()) for m in read_topic(plain, acks, expect=6, quiet=0.5))
    }
    assert acked == {**dict.fromkeys(ok_ids, "succeeded"), dead_id: "dead"}
    assert read_topic(plain, "outboxkit.relay.checkpoint", expect=1, quiet=0.5)
    processes.stop()
    _no_secret_shown(processes.output(), server)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_wrong_key_password_stops_the_relay_naming_it(
    client: str, mtls_kafka: KafkaServer, outboxkit_db_url: str, processes: Processes
) -> None:
    """A key that cannot be read never gets better by retrying: the relay exits, saying which
    setting to check (both TLS libraries say only "PEM lib")."""
    wrong = f"wrong-{uuid.uuid4().hex}"
    env = _env(outboxkit_db_url, mtls_kafka, client, **{_KEY_PASSWORD: wrong})
    index = processes.start(["relay", "run"], env)
    assert processes.procs[index][0].wait(60) != 0
    output = processes.output(index)
    assert f"cannot be decrypted with {_KEY_PASSWORD} (a wrong password?)" in output, output
    _no_secret_shown(output, mtls_kafka, wrong)


def test_an_encrypted_key_without_its_password_never_prompts(
    mtls_kafka: KafkaServer, outboxkit_db_url: str
) -> None:
    """Python's ssl asks on the terminal for a missing key password: a relay started from a
    shell would block there. It runs here on a terminal of its own and must exit instead."""
    env = _env(outboxkit_db_url, mtls_kafka, "aiokafka", _KEY_PASSWORD)
    master, replica = pty.openpty()

    def controlling_terminal() -> None:  # the new session's terminal, as a login shell's
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(
        [OUTBOXKIT, "relay", "run"],
        env=env,
        cwd=ROOT,
        stdin=replica,
        stdout=replica,
        stderr=replica,
        start_new_session=True,
        preexec_fn=controlling_terminal,
    )
    os.close(replica)
    output = b""
    deadline = time.monotonic() + 60
    try:
        while b"PASSWORD" not in output and b"pass phrase" not in output.lower():
            assert time.monotonic() < deadline, output
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    output += os.read(master, 4096)
                except OSError:  # EIO: the relay exited and closed the terminal
                    break
        if b"pass phrase" not in output.lower():
            exited = proc.wait(30)
            while select.select([master], [], [], 0)[0]:  # the rest of what it wrote
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: nothing more, the terminal is closed
                    break
                if not chunk:
                    break
                output += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        os.close(master)
    text = output.decode(errors="replace")
    assert "pass phrase" not in text.lower(), text
    assert f"the client key is encrypted and {_KEY_PASSWORD} is not set" in text, text
    assert exited != 0
    _no_secret_shown(text, mtls_kafka)


@pytest.mark.parametrize("client", CLIENTS)
def test_no_client_certificate_is_retried_with_back_off(
    client: str, mtls_kafka: KafkaServer, outboxkit_db_url: str, processes: Processes
) -> None:
    """The listener refuses the handshake; a certificate can be installed while the relay
    waits, so it keeps trying, with back-off, and does not exit."""
    env = _env(outboxkit_db_url, mtls_kafka, client, _KEY_PASSWORD, *_CLIENT_FILES)
    index = processes.start(["relay", "run"], env)
    proc = processes.procs[index][0]

    def retried() -> bool:
        assert proc.poll() is None, processes.output(index)
        return processes.output(index).count("waiting for Kafka") >= 2

    wait_for(retried, timeout=60, what="the relay waiting for Kafka twice")
    output = processes.output(index)
    assert "retrying in" in output
    if client == "confluent":  # librdkafka logs the TLS alert; aiokafka only a closed connection
        assert CLIENT_CERTIFICATE_HINT in output, output
        # Each attempt's producer logs its first refused handshake, not ~100 of them.
        failed = [line for line in output.splitlines() if " FAIL [" in line]
        assert len(failed) <= 2 * (output.count("waiting for Kafka") + 1), failed[:3]
    processes.stop()
    _no_secret_shown(processes.output(index), mtls_kafka)


def test_a_refused_clients_librdkafka_lines_are_rate_limited(
    mtls_kafka: KafkaServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No client certificate: librdkafka logs each refused handshake, some twenty a second for
    as long as the client runs. A consumer's client logs the first at once, then, after each
    window (2 s here, 60 s by default), one with the number of those it did not show."""
    window = 2.0
    monkeypatch.setattr(log_limit, "WINDOW_SECONDS", window)  # what a new client's limit takes
    settings = (
        mtls_kafka.mtls()
        .kafka_settings()
        .model_copy(update=dict.fromkeys(("ssl_certificate_location", "ssl_key_location")))
    )
    caplog.set_level(logging.INFO, logger=LIBRDKAFKA_LOGGER.name)
    consumer = ConfluentGroupConsumer(settings, f"g-{uuid.uuid4().hex[:8]}")
    started = time.monotonic()

    def refusals() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == LIBRDKAFKA_LOGGER.name and r.getMessage().startswith("FAIL ")
        ]

    def summarised() -> bool:
        consumer.poll(0.2, 10)  # serves the client's log lines
        lines = refusals()
        # At most a line a window for each of the few kinds of refusal.
        bound = 3 * (1 + (time.monotonic() - started) / window)
        assert len(lines) <= bound, f"{len(lines)} FAIL lines: {lines[:3]}"
        return any("similar lines suppressed over" in line for line in lines)

    try:
        consumer.subscribe(["payments"], lambda tps: None, lambda tps: {})
        wait_for(summarised, timeout=20, what="a FAIL line with the count of those not shown")
    finally:
        consumer.close()
    assert CLIENT_CERTIFICATE_HINT in refusals()[0]  # the hint filter still sees every line


def _no_certificate(server: KafkaServer, **update: Any) -> KafkaSettings:
    """The listener's settings without the client certificate and key (``update``: more)."""
    unset = dict.fromkeys(("ssl_certificate_location", "ssl_key_location", "ssl_key_password"))
    return server.mtls().kafka_settings().model_copy(update={**unset, **update})


async def _aiokafka_errors(settings: KafkaSettings) -> dict[str, str]:
    """The error each aiokafka client of ours raises at its first request, by client."""
    admin = AiokafkaAdmin(settings, timeout=5)
    producer = AiokafkaTransactionalProducer(settings, transactional_id=None, timeout=5)
    sender = AiokafkaRecordSender(settings, timeout=5)
    consumer = AiokafkaGroupConsumer(settings, f"g-{uuid.uuid4().hex[:8]}")
    calls = {
        "admin": lambda: admin.describe_topic("payments"),  # the relay's start-up
        "producer": producer.start,
        "sender": lambda: sender.topic_exists("payments.dlq"),  # inbox run's start-up check
        "consumer": lambda: consumer.subscribe(["payments"], lambda tps: None, lambda tps: {}),
    }
    errors: dict[str, str] = {}
    try:
        for name, call in calls.items():
            with pytest.raises(PublishError) as caught:
                await call()
            errors[name] = str(caught.value)
    finally:
        await admin.close()
        await producer.close()
        await sender.close()
        await consumer.close()
    return errors


def test_aiokafka_clients_without_a_client_certificate_name_the_settings(
    mtls_kafka: KafkaServer,
) -> None:
    """Under TLS 1.3 the broker's alert reaches aiokafka after its handshake: it sees the
    connection closed at its first request and raises only "Unable to bootstrap". Each client
    of ours now names the client-certificate settings. A wrong CA fails the handshake on the
    client's side (no certificate either): that is not the broker asking for one."""
    for name, text in asyncio.run(_aiokafka_errors(_no_certificate(mtls_kafka))).items():
        assert CLIENT_CERTIFICATE_HINT in text, (name, text)
    # The client certificate is no CA of the broker's certificate.
    wrong_ca = Path(mtls_kafka.mtls().certificate_location)
    settings = _no_certificate(mtls_kafka, ssl_ca_location=wrong_ca)
    for name, text in asyncio.run(_aiokafka_errors(settings)).items():
        assert "Unable to bootstrap" in text, (name, text)
        assert CLIENT_CERTIFICATE_HINT not in text, (name, text)


def test_aiokafka_relay_and_consumer_without_a_client_certificate_say_which_settings(
    mtls_kafka: KafkaServer, outboxkit_db_url: str, processes: Processes
) -> None:
    """What an operator reads: the relay's back-off line and ``inbox run``'s start-up failure
    (aiokafka, retried with back-off) name the settings to set, not only "Unable to bootstrap"."""
    env = _env(outboxkit_db_url, mtls_kafka, "aiokafka", _KEY_PASSWORD, *_CLIENT_FILES)
    relay = processes.start(["relay", "run"], env)
    consumer_env = {
        **env,
        "OUTBOXKIT_CONSUMER_NAME": "billing",
        "OUTBOXKIT_CONSUMER_GROUP": f"g-{uuid.uuid4().hex[:8]}",
        "OUTBOXKIT_CONSUMER_TOPICS": "payments",
    }
    args = ["inbox", "run", "--registry", "tests.fault.consumer_app:ASYNC"]
    consumer = processes.start([*args, "--dead-letter-check", "off"], consumer_env)

    def waiting() -> list[str]:
        return [line for line in processes.output(relay).splitlines() if "waiting for" in line]

    wait_for(waiting, timeout=60, what="the relay waiting for Kafka")
    assert CLIENT_CERTIFICATE_HINT in waiting()[0], processes.output(relay)

    def failed() -> list[str]:
        lines = processes.output(consumer).splitlines()
        return [line for line in lines if "Kafka consumer could not start" in line]

    wait_for(failed, timeout=60, what="inbox run saying it cannot start")
    assert CLIENT_CERTIFICATE_HINT in failed()[0], processes.output(consumer)
    assert "retrying in" in failed()[0]  # it waits for a certificate, as the relay does
    assert processes.procs[consumer][0].poll() is None
    processes.stop()
    _no_secret_shown(processes.output(), mtls_kafka)
