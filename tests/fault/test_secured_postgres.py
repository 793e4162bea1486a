"""A PostgreSQL that requires TLS, reached by every path of the product from the URL alone.

The dev stack's ``PostgresServer(tls=True)`` refuses TCP without TLS and has a CA of its own;
the product gets nothing but ``OUTBOXKIT_DATABASE_URL`` (``?sslmode=verify-full&sslrootcert=``):
``outboxkit migrate``, the application's writes (sync and async SQLAlchemy engines), the relay
(exactly-once), the consumer, a CLI read, and a client certificate (``sslcert``/``sslkey``).
Kafka is the running dev stack's. Then the failures: no TLS, a CA that did not sign the server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outboxkit import Outbox
from outboxkit.db import sqlalchemy_url
from outboxkit.devstack import PostgresServer
from outboxkit.devstack.aio import run_coroutine
from outboxkit.devstack.tls import make_server_pem
from tests.fault.test_secured_kafka import OUTBOXKIT, ROOT, Processes, _message, create_topics_at
from tests.integration.inbox_support import EFFECT_DDL, inbox_row
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

_DELAY_RE = re.compile(r"retrying in ([0-9.]+)s")


@pytest.fixture(scope="module", autouse=True)
def _kafka(outboxkit_kafka_bootstrap: str) -> Iterator[None]:
    """The suite's Kafka, self-started or external, for the processes and the topic set-up."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OUTBOXKIT_KAFKA_BOOTSTRAP", outboxkit_kafka_bootstrap)
        yield


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    pg = PostgresServer(tls=True)
    try:
        pg.start()
        yield pg
    finally:
        try:
            pg.stop()
        finally:
            pg.destroy()


@pytest.fixture(scope="module")
def url(server: PostgresServer) -> str:
    """The verified URL, migrated by ``outboxkit migrate up`` through it."""
    verified = server.url_for("postgres", sslmode="verify-full")
    done = _cli(["migrate", "up"], verified)
    assert done.returncode == 0, done.stdout + done.stderr
    return verified


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path)
    yield running
    running.stop()


def _env(db_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
    env.update(
        OUTBOXKIT_DATABASE_URL=db_url,
        OUTBOXKIT_KAFKA_BOOTSTRAP=os.environ["OUTBOXKIT_KAFKA_BOOTSTRAP"],
        OUTBOXKIT_RELAY_POLL_INTERVAL="0.2",
        # This server's database is another outbox than the suite's: a checkpoint topic of its
        # own, or relays of the suite's default group would find its checkpoint and stop.
        OUTBOXKIT_RELAY_CHECKPOINT_TOPIC=f"outboxkit.cp.{uuid.uuid4().hex[:8]}",
        PYTHONPATH=str(ROOT),
        **extra,
    )
    return env


def _cli(args: list[str], db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OUTBOXKIT, *args], env=_env(db_url), cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _write(url: str, topic: str) -> list[str]:
    """Two events through a sync engine, one through an async engine: their ids."""
    engine = create_engine(sqlalchemy_url(url))
    with Session(engine) as session, session.begin():
        written = Outbox().add_many(session, [_message(topic, f"o-{n}", n) for n in range(2)])
    engine.dispose()

    async def write_async() -> str:
        aengine = create_async_engine(sqlalchemy_url(url))
        try:
            async with AsyncSession(aengine) as session, session.begin():
                result = await Outbox().add_async(session, _message(topic, "o-async", 7))
        finally:
            await aengine.dispose()
        return str(result.event_id)

    return [str(result.event_id) for result in written] + [run_coroutine(write_async())]


def _create_topics(*names: str) -> None:
    create_topics_at(os.environ["OUTBOXKIT_KAFKA_BOOTSTRAP"], *names)


def test_every_path_over_verify_full_tls(
    server: PostgresServer, url: str, processes: Processes
) -> None:
    topic = f"pgtls-{uuid.uuid4().hex[:8]}"
    _create_topics(topic, f"{topic}.dlq")
    with psycopg.connect(url) as conn:
        conn.execute(EFFECT_DDL)
    ids = _write(url, topic)
    env = _env(
        url,
        OUTBOXKIT_RELAY_MODE="exactly_once",
        OUTBOXKIT_CONSUMER_NAME="billing",
        OUTBOXKIT_CONSUMER_GROUP=f"g-{uuid.uuid4().hex[:8]}",
        OUTBOXKIT_CONSUMER_TOPICS=topic,
    )
    processes.start(["relay", "run"], env)
    processes.start(["inbox", "run", "--registry", "tests.fault.consumer_app:SYNC"], env)

    def settled() -> bool:
        rows = [inbox_row(url, "billing", event_id) or {} for event_id in ids]
        return all(row.get("state") == "succeeded" for row in rows)

    try:
        wait_for(settled, timeout=60, what="every event handled")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; output:\n{processes.output()}") from None
    bootstrap = os.environ["OUTBOXKIT_KAFKA_BOOTSTRAP"]
    assert len(read_topic(bootstrap, topic, expect=3, quiet=0.5)) == 3  # exactly once
    shown = _cli(["inbox", "show", "--consumer", "billing"], url)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert all(event_id in shown.stdout for event_id in ids)
    processes.stop()
    assert server.password not in processes.output() + shown.stdout + shown.stderr
    assert "Traceback" not in processes.output()


def test_a_client_certificate_in_the_url_logs_in(server: PostgresServer, url: str) -> None:
    done = _cli(["outbox", "parked"], server.cert_url_for("postgres"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 parked row(s)" in done.stdout


@pytest.fixture(scope="module")
def encrypted_key(server: PostgresServer) -> tuple[Path, str]:
    """The client key encrypted (PKCS#8, AES-256), as production keys often are; its pass phrase."""
    key = server.tls_files.client_key.with_name("client-encrypted.key")
    phrase = f"phrase-{uuid.uuid4().hex}"
    encrypt = ["pkcs8", "-topk8", "-v2", "aes-256-cbc", "-passout", "env:PGTLS_PHRASE", "-in"]
    subprocess.run(
        ["openssl", *encrypt, str(server.tls_files.client_key), "-out", str(key)],
        check=True,
        capture_output=True,
        env={**os.environ, "PGTLS_PHRASE": phrase},
    )
    key.chmod(0o600)
    return key, phrase


def test_an_encrypted_key_and_its_sslpassword_log_in(
    server: PostgresServer, url: str, encrypted_key: tuple[Path, str]
) -> None:
    key, phrase = encrypted_key
    cert_url = server.cert_url_for("postgres").replace(str(server.tls_files.client_key), str(key))
    done = _cli(["outbox", "parked"], f"{cert_url}&sslpassword={phrase}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert phrase not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "command",
    [["migrate", "status"], ["inbox", "show"]],  # our own connection; a SQLAlchemy engine's
    ids=["connect", "engine"],
)
def test_an_encrypted_key_without_sslpassword_is_named_not_prompted_for(
    server: PostgresServer, url: str, encrypted_key: tuple[Path, str], command: list[str]
) -> None:
    """libpq let OpenSSL ask the terminal: the CLI (and a relay, its event loop blocked) waited
    for someone to type; with no terminal it failed as a bare "processing error"."""
    key, _ = encrypted_key
    cert_url = server.cert_url_for("postgres").replace(str(server.tls_files.client_key), str(key))
    terminal, other_end = os.openpty()  # stdin a terminal; no controlling one (a new session)
    try:
        done = subprocess.run(
            [OUTBOXKIT, *command],
            env=_env(cert_url),
            cwd=ROOT,
            stdin=other_end,
            capture_output=True,
            text=True,
            start_new_session=True,
            timeout=60,  # a prompt waits forever
        )
    finally:
        os.close(terminal)
        os.close(other_end)
    assert done.returncode != 0
    assert "Enter PEM pass phrase" not in done.stdout + done.stderr
    assert "could not load private key file" in done.stderr
    assert "Traceback" not in done.stderr
    if command[0] == "migrate":  # our own connections say what to add
        assert done.returncode == 2
        assert "an encrypted key needs its pass phrase as sslpassword" in done.stderr


_ENGINE_PROBE = """
import asyncio, sys
from outboxkit.db.engines import async_engine, sync_engine

async def connect_async(url):
    engine = async_engine(url)
    try:
        async with engine.connect():
            pass
    finally:
        await engine.dispose()

try:
    if sys.argv[2] == "sync":
        sync_engine(sys.argv[1]).connect()
    else:
        asyncio.run(connect_async(sys.argv[1]))
except Exception as exc:
    print(exc)
    sys.exit(3)
"""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_our_engines_never_prompt_for_a_key_pass_phrase(
    server: PostgresServer, url: str, encrypted_key: tuple[Path, str], kind: str
) -> None:
    """Every SQLAlchemy engine outboxkit makes (``inbox run``, the ``inbox`` commands,
    ``outboxkit verify``'s writers, the demo) comes from ``outboxkit.db.engines``."""
    key, _ = encrypted_key
    cert_url = server.cert_url_for("postgres").replace(str(server.tls_files.client_key), str(key))
    terminal, other_end = os.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _ENGINE_PROBE, cert_url, kind],
            env=_env(cert_url),
            cwd=ROOT,
            stdin=other_end,
            capture_output=True,
            text=True,
            start_new_session=True,
            timeout=60,
        )
    finally:
        os.close(terminal)
        os.close(other_end)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Enter PEM pass phrase" not in done.stdout + done.stderr
    assert "could not load private key file" in done.stdout


def test_a_key_not_of_the_certificate_is_named(server: PostgresServer, url: str) -> None:
    files = server.tls_files
    wrong_key = server.cert_url_for("postgres").replace(str(files.client_key), str(files.key))
    done = _cli(["migrate", "status"], wrong_key)
    assert done.returncode == 2
    assert "could not load private key file" in done.stderr
    assert "needs its pass phrase" not in done.stderr  # not a password problem
    assert "Traceback" not in done.stderr


def test_no_tls_is_refused_by_name_and_the_relay_backs_off(
    server: PostgresServer, url: str, processes: Processes
) -> None:
    plain = server.url_for("postgres", sslmode="disable")
    done = _cli(["migrate", "status"], plain)
    assert done.returncode == 2
    assert "pg_hba.conf rejects connection" in done.stderr
    assert "no encryption" in done.stderr
    assert server.password not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    index = processes.start(["relay", "run"], _env(plain))
    delays = wait_for(
        lambda: (found := _DELAY_RE.findall(processes.output(index)))[4:] and found,
        timeout=30,
        what=f"five refusals; output:\n{processes.output(index)}",
    )
    # Full jitter in [base/2, base] of a doubling base: the fifth wait is at least 8x the first.
    assert float(delays[4]) > float(delays[0])
    processes.stop()
    output = processes.output(index)
    assert "no encryption" in output
    assert server.password not in output
    assert "Traceback" not in output


def test_a_ca_that_did_not_sign_the_server_is_named(
    server: PostgresServer, url: str, tmp_path: Path
) -> None:
    other_ca = make_server_pem(tmp_path / "other", "nobody").ca_pem
    wrong = url.replace(str(server.tls_files.ca_pem), str(other_ca))
    done = _cli(["migrate", "status"], wrong)
    assert done.returncode == 2
    assert "certificate verify failed" in done.stderr
    assert server.password not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
