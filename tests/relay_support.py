"""Test helpers for the relay: insert outbox rows by SQL, read topics back, run relays.

Rows are inserted directly (not through the outbox write API) so the relay tests depend only on
the schema. Relays run in-process (``running_relay``) or as real processes (``RelayProcess``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from click.testing import CliRunner

from outboxkit import db
from outboxkit.cli import main as cli_main
from outboxkit.faults import FaultPoints
from outboxkit.relay.connections import ProcessLeases
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.runner import Relay
from outboxkit.relay.shard_worker import ShardWorker
from outboxkit.settings import Settings, load_settings
from outboxkit.wire import content_digest, headers_to_dict
from tests.support.topics import read_topic

SCHEMA = "outboxkit"
ROOT = Path(__file__).resolve().parent.parent
KAFKA_CLIENTS = ["confluent", "aiokafka"]  # parametrise relay tests over both
# Rows per Kafka transaction with --batch-size 10 (tests that count transactions pin one):
# one claim each, or three claims of 10 (a backlog keeps every claim full; the time bound is
# lifted so the boundary is by rows only). Claims keep their size (no adaptive growth).
ONE_CLAIM = {"OUTBOXKIT_RELAY_TRANSACTION_MAX_ROWS": "10", "OUTBOXKIT_RELAY_MAX_BATCH_SIZE": "10"}
THREE_CLAIMS = {
    "OUTBOXKIT_RELAY_MAX_BATCH_SIZE": "10",
    "OUTBOXKIT_RELAY_TRANSACTION_MAX_ROWS": "30",
    "OUTBOXKIT_RELAY_TRANSACTION_MAX_MS": "60000",
}


def set_shard_count(db_url: str, count: int) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"UPDATE {SCHEMA}.outbox_setting SET shard_count = %s", (count,))


def insert_rows(
    conn_or_url: str | psycopg.Connection,
    topic: str,
    items: Iterable[tuple[str | None, bytes]],
    *,
    headers: dict[str, str] | None = None,
    event_type: str | None = "test.event",
) -> list[int]:
    """Insert (key, payload) rows in order; returns their ids. Commits unless given a connection
    (then the caller's transaction decides)."""
    own = isinstance(conn_or_url, str)
    conn = psycopg.connect(conn_or_url, autocommit=True) if own else conn_or_url
    assert isinstance(conn, psycopg.Connection)
    ids = []
    try:
        for key, payload in items:
            event_id = uuid.uuid4()
            digest = content_digest(
                topic=topic,
                key=key,
                event_type=event_type,
                content_type="application/json",
                payload=payload,
            )
            row = conn.execute(
                f"INSERT INTO {SCHEMA}.outbox_message (event_id, idempotency_key, content_digest,"
                " topic, message_key, payload, headers, event_type, shard)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s,"
                f" {SCHEMA}.outbox_shard(%s, %s,"
                f" (SELECT shard_count FROM {SCHEMA}.outbox_setting))) RETURNING id",
                (
                    event_id,
                    f"idem-{event_id}",
                    digest,
                    topic,
                    key,
                    payload,
                    json.dumps(headers or {}),
                    event_type,
                    key,
                    event_id,
                ),
            ).fetchone()
            assert row is not None
            ids.append(int(row[0]))
    finally:
        if own:
            conn.close()
    return ids


def payloads(key: str, count: int, start: int = 0) -> list[tuple[str, bytes]]:
    return [(key, json.dumps({"k": key, "n": n}).encode()) for n in range(start, start + count)]


def row_states(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT state, count(*) FROM {SCHEMA}.outbox_message GROUP BY state"
        ).fetchall()
    return {str(state): int(n) for state, n in rows}


def pending_count(db_url: str) -> int:
    return row_states(db_url).get("pending", 0)


@dataclass
class Received:
    key: str | None
    value: bytes
    headers: dict[str, str]
    partition: int
    offset: int

    @property
    def body(self) -> dict[str, Any]:
        return dict(json.loads(self.value))


def consume(
    bootstrap: str,
    topic: str,
    *,
    expect: int,
    timeout: float = 60.0,
    quiet: float = 2.0,
) -> list[Received]:
    """Everything a ``read_committed`` consumer sees, as :class:`Received` records."""
    return [
        Received(
            msg.key().decode() if msg.key() is not None else None,
            msg.value(),
            headers_to_dict(msg.headers()),
            msg.partition() or 0,
            msg.offset() or 0,
        )
        for msg in read_topic(bootstrap, topic, expect=expect, timeout=timeout, quiet=quiet)
    ]


def assert_exactly_once_in_order(
    received: list[Received], expected: list[tuple[str, bytes]]
) -> None:
    """Each expected message exactly once, and per key in insertion order."""
    values = [r.value for r in received]
    assert sorted(values) == sorted(v for _, v in expected), (
        f"got {len(values)} messages, expected {len(expected)}; "
        f"duplicates: {len(values) - len(set(values))}"
    )
    by_key: dict[str | None, list[bytes]] = {}
    for r in received:
        by_key.setdefault(r.key, []).append(r.value)
    want: dict[str | None, list[bytes]] = {}
    for k, v in expected:
        want.setdefault(k, []).append(v)
    assert by_key == want


def relay_settings(
    db_url: str, bootstrap: str, *, client: str | None = None, **relay: Any
) -> Settings:
    """Settings for an in-process relay: fast leases and polls, a fresh checkpoint topic."""
    values: dict[str, Any] = {
        "lease_ttl": 3.0,
        "poll_interval": 0.5,
        "backoff_max": 1.0,
        "kafka_timeout": 15.0,
        "checkpoint_topic": f"outboxkit.checkpoint.{uuid.uuid4().hex[:8]}",
    }
    values.update(relay)
    return load_settings(
        overrides={
            "database": {"url": db_url},
            "kafka": {"bootstrap": bootstrap, "client": client},
            "relay": values,
        }
    )


@contextlib.asynccontextmanager
async def running_relay(settings: Settings, **kwargs: Any) -> AsyncIterator[Relay]:
    relay = Relay(settings, **kwargs)
    task = asyncio.create_task(relay.run())
    try:
        await asyncio.wait_for(relay.ready.wait(), 60)
        yield relay
    finally:
        relay.stop.set()
        await asyncio.wait_for(task, 60)


@dataclass
class RelayProcess:
    """``python -m outboxkit.relay run`` as a real separate process.

    ``client`` picks the Kafka client (``OUTBOXKIT_KAFKA_CLIENT``); ``base_env`` replaces this
    process's environment (e.g. ``env_without("confluent_kafka")``).
    """

    db_url: str
    bootstrap: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    client: str | None = None
    base_env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    checkpoint_topic: str = field(default_factory=lambda: f"outboxkit.cp.{uuid.uuid4().hex[:8]}")

    def start(self) -> RelayProcess:
        base = dict(self.base_env if self.base_env is not None else os.environ)
        for name in list(base):
            if name.startswith("OUTBOXKIT_") and name != "OUTBOXKIT_TEST_BLOCK_IMPORTS":
                del base[name]  # only what this test sets
        env = {
            **base,
            "OUTBOXKIT_DATABASE_URL": self.db_url,
            "OUTBOXKIT_KAFKA_BOOTSTRAP": self.bootstrap,
            "OUTBOXKIT_RELAY_LEASE_TTL": "3",
            "OUTBOXKIT_RELAY_POLL_INTERVAL": "0.5",
            "OUTBOXKIT_RELAY_CHECKPOINT_TOPIC": self.checkpoint_topic,
            **({"OUTBOXKIT_KAFKA_CLIENT": self.client} if self.client else {}),
            **self.env,
        }
        handle, name = tempfile.mkstemp(prefix="relay-", suffix=".log")
        os.close(handle)
        self.log_path = Path(name)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "outboxkit.relay", "run", *self.args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def holds(self, shard: int = 0, group: str = "default") -> bool:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            row = conn.execute(
                f"SELECT holder FROM {SCHEMA}.relay_lease WHERE relay_group = %s AND shard = %s"
                " AND holder IS NOT NULL AND expires_at > now()",
                (group, shard),
            ).fetchone()
        return row is not None and f":{self.pid}:" in str(row[0])

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()


def states_by_key(db_url: str) -> dict[str | None, list[str]]:
    """Each message key's row states, in id order."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            f"SELECT message_key, state FROM {SCHEMA}.outbox_message ORDER BY id"
        ).fetchall()
    out: dict[str | None, list[str]] = {}
    for key, state in rows:
        out.setdefault(key, []).append(state)
    return out


def cli_ok(db_url: str, *args: str) -> str:
    """The output of an operator command that must succeed on ``db_url``."""
    result = CliRunner().invoke(cli_main, list(args), env={"OUTBOXKIT_DATABASE_URL": db_url})
    assert result.exit_code == 0, result.output
    return result.output


def shard_worker(settings: Settings, *, leases: ProcessLeases | None = None) -> ShardWorker:
    """Shard 0's worker, on its own: no producer may be built (a test that gets that far fails)."""

    def no_producer(shard: int, slot: int) -> Any:
        raise AssertionError("this test builds no producer")

    return ShardWorker(
        settings,
        0,
        holder="me",
        stop=asyncio.Event(),
        producer_factory=no_producer,
        checkpoints=None,
        metrics=RelayMetrics(),
        faults=FaultPoints(""),
        leases=leases,
    )


def day_lease(url: str, shard: int = 0, now: datetime | None = None) -> LeaseTerm:
    """A day's lease of ``shard`` in group "default", as of ``now`` (a test's clock; the
    database's when None): still held at the later clock a fenced call of the test passes."""
    day = 24 * 3600
    with psycopg.connect(url, autocommit=True) as conn:
        row = db.one(
            conn,
            db.query("relay", "lease_acquire", SCHEMA),
            {"group": "default", "shard": shard, "holder": "me", "ttl": day, "now": now},
        )
    assert row is not None
    return LeaseTerm("default", shard, "me", int(row[0]), float(day), time.monotonic() + day)
