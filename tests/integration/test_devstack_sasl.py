"""The dev stack's SASL_SSL Kafka: real clients (confluent-kafka and aiokafka) authenticate with
SCRAM-SHA-512 over TLS checked against the CA made at start-up; anything else is refused."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from outboxkit.devstack import KafkaServer, OAuthBearerListener, SaslSslListener
from outboxkit.devstack.state import live_states

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-c", "from outboxkit.cli import main; main()"]
WRONG_PASSWORD = "not-the-password-" + uuid.uuid4().hex[:8]


@pytest.fixture
def listener(outboxkit_secure_kafka: KafkaServer) -> SaslSslListener:
    return outboxkit_secure_kafka.sasl_ssl


@pytest.fixture
def topic(listener: SaslSslListener) -> str:
    """A fresh topic, created over the authenticated listener."""
    name = f"sasl-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(_conf(listener))
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    for future in futures.values():
        future.result(timeout=60)
    return name


def _conf(listener: SaslSslListener) -> dict[str, Any]:
    return dict(listener.librdkafka_config())


def _aiokafka_kwargs(listener: SaslSslListener) -> dict[str, Any]:
    return {
        "bootstrap_servers": listener.bootstrap,
        "security_protocol": listener.protocol,
        "sasl_mechanism": listener.mechanism,
        "sasl_plain_username": listener.username,
        "sasl_plain_password": listener.password,
        "ssl_context": create_ssl_context(cafile=listener.ca_location),
    }


def _consume_values(config: dict[str, Any], topic: str, until: bytes) -> list[bytes]:
    """Everything read from ``topic`` until the record ``until`` arrives (deadline 60 s)."""
    consumer = Consumer(
        {
            **config,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while until not in values and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            values.append(message.value() or b"")
    finally:
        consumer.close()
    assert until in values, f"{until!r} not read within 60 s (got {values})"
    return values


def test_confluent_produce_and_consume(listener: SaslSslListener, topic: str) -> None:
    producer = Producer(_conf(listener))
    for i in range(3):
        producer.produce(topic, key=b"k", value=f"v{i}".encode())
    assert producer.flush(30) == 0
    assert _consume_values(_conf(listener), topic, b"v2") == [b"v0", b"v1", b"v2"]


async def test_aiokafka_produce_and_consume(listener: SaslSslListener, topic: str) -> None:
    producer = AIOKafkaProducer(**_aiokafka_kwargs(listener))
    await producer.start()
    try:
        for i in range(3):
            await producer.send_and_wait(topic, key=b"k", value=f"v{i}".encode())
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        group_id=f"g-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        **_aiokafka_kwargs(listener),
    )
    await consumer.start()
    values: list[bytes] = []
    try:
        async with asyncio.timeout(60):
            async for message in consumer:
                assert message.value is not None
                values.append(message.value)
                if len(values) == 3:
                    break
    finally:
        await consumer.stop()
    assert values == [b"v0", b"v1", b"v2"]


def test_confluent_transactions_commit_and_abort(listener: SaslSslListener, topic: str) -> None:
    producer = Producer({**_conf(listener), "transactional.id": f"tx-{topic}"})
    producer.init_transactions(60)
    for value, commit in ((b"committed-1", True), (b"aborted", False), (b"committed-2", True)):
        producer.begin_transaction()
        producer.produce(topic, value=value)
        producer.flush(30)
        if commit:
            producer.commit_transaction(60)
        else:
            producer.abort_transaction(60)
    values = _consume_values(_conf(listener), topic, b"committed-2")
    assert values == [b"committed-1", b"committed-2"]


async def test_aiokafka_transactions_commit_and_abort(
    listener: SaslSslListener, topic: str
) -> None:
    producer = AIOKafkaProducer(transactional_id=f"tx-{topic}", **_aiokafka_kwargs(listener))
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-1")
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"aborted")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed-2")
    finally:
        await producer.stop()
    values = _consume_values(_conf(listener), topic, b"committed-2")
    assert values == [b"committed-1", b"committed-2"]


async def _start_error(producer: AIOKafkaProducer) -> Exception | None:
    """What ``start`` raised within 20 s (a timeout is returned too, and fails the caller)."""
    try:
        async with asyncio.timeout(20):
            await producer.start()
    except Exception as exc:
        return exc
    finally:
        await producer.stop()
    return None


def _first_errors(config: dict[str, Any], timeout: float = 20.0) -> list[KafkaError]:
    """The errors a producer reports while trying to reach the broker (bounded wait)."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append, "log_level": 0})
    deadline = time.monotonic() + timeout
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    return errors


def test_confluent_wrong_password_is_an_authentication_failure(
    listener: SaslSslListener,
) -> None:
    errors = _first_errors({**_conf(listener), "sasl.password": WRONG_PASSWORD})
    assert errors, "no error reported within 20 s"  # the bound is _first_errors' own wait
    assert errors[0].code() == KafkaError._AUTHENTICATION, errors[0]
    assert all(WRONG_PASSWORD not in err.str() for err in errors)
    assert all(listener.password not in err.str() for err in errors)


async def test_aiokafka_wrong_password_is_an_authentication_failure(
    listener: SaslSslListener, caplog: pytest.LogCaptureFixture
) -> None:
    kwargs = {**_aiokafka_kwargs(listener), "sasl_plain_password": WRONG_PASSWORD}
    with caplog.at_level(logging.ERROR, logger="aiokafka"):
        error = await _start_error(AIOKafkaProducer(**kwargs))
    assert isinstance(error, KafkaConnectionError), error
    assert "SaslAuthenticationFailed" in caplog.text
    assert WRONG_PASSWORD not in caplog.text
    assert listener.password not in caplog.text


@pytest.mark.parametrize(
    ("protocol", "reachable"),
    [("SASL_SSL", True), ("SASL_PLAINTEXT", False), ("PLAINTEXT", False), ("SSL", False)],
)
def test_confluent_needs_tls_and_sasl(
    listener: SaslSslListener, protocol: str, reachable: bool
) -> None:
    config: dict[str, Any] = {**_conf(listener), "security.protocol": protocol, "log_level": 0}
    if "SASL" not in protocol:
        for key in ("sasl.mechanism", "sasl.username", "sasl.password"):
            config.pop(key)
    admin = AdminClient(config)
    if reachable:
        assert admin.list_topics(timeout=20).brokers
    else:
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=5)


def test_confluent_refuses_a_broker_its_ca_did_not_sign(listener: SaslSslListener) -> None:
    errors = _first_errors({**_conf(listener), "ssl.ca.location": "probe"})
    assert errors
    # librdkafka names the failed verification _SSL, or _TRANSPORT when the handshake's
    # failure reaches it as the connection's (seen once in CI): the refusal either way.
    assert errors[0].code() in (KafkaError._SSL, KafkaError._TRANSPORT), errors[0]
    assert "certificate verify failed" in errors[0].str(), errors[0]


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SASL_PLAINTEXT"])
async def test_aiokafka_without_tls_cannot_connect(
    listener: SaslSslListener, protocol: str
) -> None:
    kwargs = {**_aiokafka_kwargs(listener), "security_protocol": protocol}
    kwargs.pop("ssl_context")
    error = await _start_error(AIOKafkaProducer(**kwargs))
    assert isinstance(error, KafkaConnectionError), error


def test_secrets_stay_off_command_lines_and_out_of_readable_files(
    outboxkit_secure_kafka: KafkaServer,
) -> None:
    server = outboxkit_secure_kafka
    assert server.service is not None
    assert server.service.pid is not None
    password = server.sasl_ssl.password.encode()
    assert password not in Path(f"/proc/{server.service.pid}/cmdline").read_bytes()
    assert (server.base_dir / "server.properties").stat().st_mode & 0o077 == 0
    assert not (server.base_dir / "format.args").exists()
    assert not (server.base_dir / "tls" / "ca.key").exists()
    for path in server.base_dir.rglob("*"):
        if path.is_file() and path.stat().st_mode & 0o004:
            assert password not in path.read_bytes(), path


def test_plaintext_listener_is_loopback_set_up_only(outboxkit_secure_kafka: KafkaServer) -> None:
    server = outboxkit_secure_kafka
    assert server.plaintext_bootstrap.startswith("127.0.0.1:")
    assert server.plaintext_bootstrap != server.bootstrap
    admin = AdminClient({"bootstrap.servers": server.plaintext_bootstrap})
    brokers = admin.list_topics(timeout=20).brokers
    # A client learns only the listener it connected through.
    assert {f"{b.host}:{b.port}" for b in brokers.values()} == {server.plaintext_bootstrap}


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_dev_up_sasl_ssl_then_dev_env_gives_working_settings(tmp_path: Path) -> None:
    """`dev up --kafka-security sasl_ssl` starts a secured Kafka; the variables `dev env` prints
    (and nothing else) get a client in; PostgreSQL, named by the environment, is reported as
    external and not started."""
    # Never connected to by `dev up`: it only reports and exports it.
    external_db = "postgresql://app:db-secret@127.0.0.1:1/app"
    env = {**os.environ, "OUTBOXKIT_DATABASE_URL": external_db}
    env.pop("OUTBOXKIT_KAFKA_BOOTSTRAP", None)
    with (tmp_path / "up.out").open("w") as out:
        up = subprocess.Popen(
            [*CLI, "dev", "up", "--kafka-security", "sasl_ssl"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_for(
            lambda: up.pid in {s.pid for s in live_states()} or up.poll() is not None,
            180,
            "dev up to publish its state",
        )
        assert up.poll() is None, (tmp_path / "up.out").read_text()
        printed = subprocess.run(
            [*CLI, "dev", "env", "--pid", str(up.pid)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"export OUTBOXKIT_DATABASE_URL={shlex.quote(external_db)}" in printed
        probe = (
            "import os; from confluent_kafka.admin import AdminClient;"
            "e = os.environ; print(len(AdminClient({"
            "'bootstrap.servers': e['OUTBOXKIT_KAFKA_BOOTSTRAP'],"
            "'security.protocol': e['OUTBOXKIT_KAFKA_SECURITY_PROTOCOL'],"
            "'sasl.mechanism': e['OUTBOXKIT_KAFKA_SASL_MECHANISM'],"
            "'sasl.username': e['OUTBOXKIT_KAFKA_SASL_USERNAME'],"
            "'sasl.password': e['OUTBOXKIT_KAFKA_SASL_PASSWORD'],"
            "'ssl.ca.location': e['OUTBOXKIT_KAFKA_SSL_CA_LOCATION'],"
            "}).list_topics(timeout=20).brokers))"
        )
        clean = {k: v for k, v in env.items() if not k.startswith("OUTBOXKIT_")}
        result = subprocess.run(
            ["sh", "-c", f'{printed}\nexec "$0" -c "$1"', sys.executable, probe],
            env=clean,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "1"
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(90)
    output = (tmp_path / "up.out").read_text()
    assert "SASL_SSL SCRAM-SHA-512" in output
    assert "external, from OUTBOXKIT_DATABASE_URL" in output
    assert "db-secret" not in output
    listener_password = [
        line.split("=", 1)[1] for line in printed.splitlines() if "SASL_PASSWORD=" in line
    ]
    assert listener_password
    assert listener_password[0].strip("'") not in output
    assert "stopped" in output
    assert up.pid not in {s.pid for s in live_states()}


def test_restart_keeps_certificates_and_credentials(
    outboxkit_secure_kafka: KafkaServer, listener: SaslSslListener, topic: str
) -> None:
    ca_before = Path(listener.ca_location).read_bytes()
    outboxkit_secure_kafka.restart()
    assert Path(listener.ca_location).read_bytes() == ca_before
    assert outboxkit_secure_kafka.sasl_ssl == listener
    producer = Producer(_conf(listener))
    producer.produce(topic, value=b"after-restart")
    assert producer.flush(30) == 0
    assert _consume_values(_conf(listener), topic, b"after-restart")


def test_oauthbearer_is_refused_unless_asked_for(listener: SaslSslListener) -> None:
    """Unsigned OAUTHBEARER tokens let anyone in as anyone: the default secured broker (and so
    `dev up --kafka-security sasl_ssl`) offers SCRAM only; ``oauthbearer=True`` adds it."""
    unsigned = OAuthBearerListener(
        bootstrap=listener.bootstrap, principal="anyone", ca_location=listener.ca_location
    )
    errors = _first_errors(unsigned.librdkafka_config())
    assert errors, "no error reported within 20 s"
    assert errors[0].code() == KafkaError._AUTHENTICATION, errors[0]
