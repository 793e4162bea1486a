"""The consumer acceptance cases with consumers as real processes (both drivers).

Each test starts ``outboxkit inbox run`` subprocesses against the self-started PostgreSQL and
Kafka (settings as ``OUTBOXKIT_*`` variables), produces messages straight to Kafka with the
outboxkit headers, and judges the outcome in the database: effect rows, inbox rows, rejection
log, dead-letter topic. Two more run it with only one Kafka client library importable.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.fault.inbox_workers import OUTBOXKIT, Worker
from tests.integration.inbox_support import (
    effects,
    fetch,
    inbox_row,
    produce,
    produce_event,
)
from tests.support.env import service_env
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]
CANCEL = [OUTBOXKIT, "inbox", "cancel", "--consumer", "billing"]


def _row(db_url: str, event_id: str) -> dict[str, Any]:
    return inbox_row(db_url, "billing", event_id) or {}


def test_sigkill_after_db_commit_before_offset_commit_applies_once(
    spawn: Callable[..., Worker],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    event_id = str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o-1", 10)
    doomed = spawn(topic, group=group, fault="after_db_commit")
    assert doomed.wait_exit() == -signal.SIGKILL, doomed.output()
    assert _row(outboxkit_db_url, event_id)["state"] == "succeeded"  # committed before the kill
    spawn(topic, group=group)  # offset was never committed: the event comes again
    wait_for(lambda: _row(outboxkit_db_url, event_id).get("duplicate_count") == 1, what="dup")
    assert effects(outboxkit_db_url) == [(event_id, "o-1", 10)]
    row = _row(outboxkit_db_url, event_id)
    assert (row["state"], row["attempts"]) == ("succeeded", 1)


def test_sigkill_between_batch_commit_and_offset_commit_applies_each_once(
    spawn: Callable[..., Worker],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Four events in one batch: its one transaction commits, the process dies before any
    offset commit; the next worker gets all four again and skips each as a duplicate."""
    topic = outboxkit_topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    ids = [str(uuid.uuid4()) for _ in range(4)]
    for n, event_id in enumerate(ids):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o-{n}", n)
    env = {"OUTBOXKIT_CONSUMER_BATCH_MAX_MS": "500"}
    doomed = spawn(topic, group=group, fault="after_db_commit", extra_env=env)
    assert doomed.wait_exit() == -signal.SIGKILL, doomed.output()
    finished = {_row(outboxkit_db_url, e)["finished_at"] for e in ids}
    assert len(finished) == 1, "the four were not committed in one transaction"
    spawn(topic, group=group, extra_env=env)
    for event_id in ids:
        wait_for(
            lambda e=event_id: _row(outboxkit_db_url, e).get("duplicate_count") == 1,
            what=f"duplicate of {event_id}",
        )
    assert [e[0] for e in effects(outboxkit_db_url)] == ids
    assert {_row(outboxkit_db_url, e)["attempts"] for e in ids} == {1}


def test_duplicates_reused_ids_and_garbage(
    spawn: Callable[..., Worker],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    first, last = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, first, "o-1", 10)
    produce_event(outboxkit_kafka_bootstrap, topic, first, "o-1", 10)  # a relay duplicate
    produce_event(outboxkit_kafka_bootstrap, topic, first, "o-1", 99999)  # same id, other content
    produce(outboxkit_kafka_bootstrap, topic, [(None, b"\x89PNG garbage \x00\xff", [])])
    produce_event(outboxkit_kafka_bootstrap, topic, last, "o-2", 20)
    worker = spawn(topic, group=f"g-{uuid.uuid4().hex[:8]}")
    wait_for(lambda: _row(outboxkit_db_url, last).get("state") == "succeeded", what="last")
    assert effects(outboxkit_db_url) == [(first, "o-1", 10), (last, "o-2", 20)]
    row = _row(outboxkit_db_url, first)
    assert (row["state"], row["duplicate_count"], row["kafka_offset"]) == ("succeeded", 1, 0)
    rejections = fetch(
        outboxkit_db_url,
        "SELECT event_id, kafka_offset, reason FROM outboxkit.inbox_rejection"
        " ORDER BY kafka_offset",
    )
    assert [(r[0], r[1]) for r in rejections] == [(first, 2), (None, 3)]
    assert "different content" in rejections[0][2]
    assert "no event-id" in rejections[1][2]
    assert worker.proc.poll() is None, worker.output()  # still running: no crash loop


def test_always_failing_handler_dead_letter_then_partition_proceeds(
    spawn: Callable[..., Worker],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    dlq = outboxkit_topic(prefix="dlq")
    doomed, later = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, doomed, "fail-1", 1)
    produce_event(outboxkit_kafka_bootstrap, topic, later, "o-later", 2)
    spawn(
        topic,
        group=f"g-{uuid.uuid4().hex[:8]}",
        args=("--max-attempts", "3", "--retry-delay", "0.2", "--dead-letter", dlq),
    )
    wait_for(lambda: _row(outboxkit_db_url, later).get("state") == "succeeded", what="later")
    row = _row(outboxkit_db_url, doomed)
    assert (row["state"], row["attempts"]) == ("dead", 3)
    assert "payment provider said no (attempt 3)" in row["last_error"]
    assert row["finished_at"] < _row(outboxkit_db_url, later)["finished_at"]
    assert effects(outboxkit_db_url) == [(later, "o-later", 2)]
    records = read_topic(outboxkit_kafka_bootstrap, dlq, expect=1)
    assert len(records) == 1
    headers = dict(records[0].headers())
    assert headers["dlq-event-id"] == doomed.encode()
    assert b"payment provider said no (attempt 3)" in headers["dlq-error"]
    assert headers["dlq-attempts"] == b"3"


def test_rebalance_mid_handler_one_effect(
    adapter: str,
    spawn: Callable[..., Worker],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """A batch o-1, slow-2, o-3 (one partition): slow-2 outlives max.poll.interval, so the
    partition goes to a second member, which claims all three with newer tokens and applies
    them. The first member's batch is fenced: slow-2's lease is lost, o-1's succeeded mark is
    refused by token (its transaction rolls back), o-3 never runs there. Each effect once.
    The checks that the three were one batch (one claim statement: one created_at; o-1 and o-3
    outcomes) fail when records are processed one at a time."""
    topic = outboxkit_topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    first_id, event_id, last_id = (str(uuid.uuid4()) for _ in range(3))
    if adapter == "confluent":
        config = ["session.timeout.ms=6000", "max.poll.interval.ms=6000"]
        config += ["heartbeat.interval.ms=1000"]
    else:
        config = ["session_timeout_ms=6000", "max_poll_interval_ms=6000"]
        config += ["heartbeat_interval_ms=1000"]
    args: list[str] = ["--lease-seconds", "1.5"]
    for item in config:
        args += ["--kafka-option", item]
    env = {"APP_SLOW_SECONDS": "25", "OUTBOXKIT_CONSUMER_BATCH_MAX_MS": "500"}
    produce_event(outboxkit_kafka_bootstrap, topic, first_id, "o-1", 1)
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "slow-2", 10)
    produce_event(outboxkit_kafka_bootstrap, topic, last_id, "o-3", 3)
    first = spawn(topic, group=group, extra_env=env, args=tuple(args))
    wait_for(lambda: _row(outboxkit_db_url, event_id).get("attempts") == 1, what="first claim")
    # One claim statement for the three (a batch), not three: one transaction, one created_at.
    claimed = {_row(outboxkit_db_url, e).get("created_at") for e in (first_id, event_id, last_id)}
    assert len(claimed) == 1, claimed
    assert None not in claimed, "o-3 was not claimed with the others"
    second = spawn(topic, group=group, extra_env=env, args=tuple(args))
    for done in (first_id, event_id, last_id):
        wait_for(
            lambda e=done: _row(outboxkit_db_url, e).get("state") == "succeeded",
            timeout=120,
            what=f"{done} succeeded",
        )
    # The slow first run was fenced (lease lost) and rolled back.
    wait_for(
        lambda: _row(outboxkit_db_url, event_id)["lease_lost_count"] >= 1,
        timeout=60,
        what="first run fenced",
    )
    # o-1 ran in the first member's batch too: either that transaction committed it (aiokafka
    # sees the revoke at once and ends the batch before anyone re-claims o-1), or its mark was
    # refused by the newer token and the batch rolled back (confluent). Never both.
    # The first member records o-1's lost lease after slow-2's: wait for o-1's own outcome.
    wait_for(
        lambda: (
            (o := _row(outboxkit_db_url, first_id))["lease_lost_count"] >= 1
            or o["duplicate_count"] >= 1
            or o["attempts"] == 1
        ),
        timeout=60,
        what="o-1's outcome in the first member",
    )
    o1 = _row(outboxkit_db_url, first_id)
    assert (o1["lease_lost_count"] >= 1) != (o1["duplicate_count"] >= 1 or o1["attempts"] == 1)
    if adapter == "confluent":  # the poll loop is blocked by the handler: no early revoke
        assert (o1["lease_lost_count"], o1["attempts"]) == (1, 2), o1
    # o-3 was claimed in the fenced batch but never run there: no lost lease, and its one effect
    # is from its last claim. The fenced batch gave its claim back (attempts 1) or the second
    # member took it over first (attempts 2); with confluent always the latter.
    o3 = _row(outboxkit_db_url, last_id)
    assert (o3["lease_lost_count"], o3["duplicate_count"]) == (0, 0), o3
    assert o3["attempts"] in ((2,) if adapter == "confluent" else (1, 2)), o3
    assert fetch(
        outboxkit_db_url, "SELECT attempt FROM public.effect WHERE event_id = %s", (last_id,)
    ) == [(o3["attempts"],)]
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted([first_id, event_id, last_id])
    assert fetch(
        outboxkit_db_url, "SELECT attempt FROM public.effect WHERE event_id = %s", (event_id,)
    ) == [(2,)]
    assert _row(outboxkit_db_url, event_id)["attempts"] == 2
    assert first.proc.poll() is None, first.output()
    assert second.proc.poll() is None, second.output()


def test_cancel_during_processing_via_cli_sticks(
    spawn: Callable[..., Worker],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    waiting, after = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, waiting, "wait-1", 10)
    spawn(topic, group=f"g-{uuid.uuid4().hex[:8]}", args=("--lease-seconds", "0.6"))
    wait_for(lambda: _row(outboxkit_db_url, waiting).get("state") == "processing", what="claim")
    result = subprocess.run(
        [*CANCEL, "--event-id", waiting, "--reason", "customer withdrew"],
        env=service_env(outboxkit_db_url, outboxkit_kafka_bootstrap),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "cancelled" in result.stdout
    wait_for(lambda: _row(outboxkit_db_url, waiting)["lease_lost_count"] == 1, what="refused")
    row = _row(outboxkit_db_url, waiting)
    assert (row["state"], row["last_error"]) == ("cancelled", "customer withdrew")
    assert effects(outboxkit_db_url, waiting) == []
    produce_event(outboxkit_kafka_bootstrap, topic, after, "o-after", 1)
    wait_for(lambda: _row(outboxkit_db_url, after).get("state") == "succeeded", what="after")
    assert _row(outboxkit_db_url, waiting)["state"] == "cancelled"
    again = subprocess.run(
        [*CANCEL, "--event-id", after],
        env=service_env(outboxkit_db_url, outboxkit_kafka_bootstrap),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert again.returncode == 1
    assert "already ended: succeeded" in again.stderr


class _PaymentServer(ThreadingHTTPServer):
    """A fake payment provider: applies a charge once per idempotency key."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _PaymentHandler)
        self.lock = threading.Lock()
        self.charges: dict[str, dict[str, Any]] = {}
        self.requests = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _PaymentHandler(BaseHTTPRequestHandler):
    server: _PaymentServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = self.headers["Idempotency-Key"]
        with self.server.lock:
            self.server.requests += 1
            charge = self.server.charges.setdefault(
                key, {"charge_id": f"ch_{len(self.server.charges) + 1}", **body}
            )
        data = json.dumps(charge).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def payment_server() -> Iterator[_PaymentServer]:
    server = _PaymentServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_external_charge_applied_once_when_killed_between_call_and_commit(
    spawn: Callable[..., Worker],
    payment_server: _PaymentServer,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    event_id = str(uuid.uuid4())
    env = {"APP_PAYMENT_URL": payment_server.url}
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "pay-1", 4200)
    doomed = spawn(topic, group=group, fault="before_db_commit", extra_env=env)
    assert doomed.wait_exit() == -signal.SIGKILL, doomed.output()
    assert payment_server.requests == 1  # the call happened, the DB commit did not
    assert effects(outboxkit_db_url) == []
    assert _row(outboxkit_db_url, event_id)["state"] == "processing"
    spawn(topic, group=group, extra_env=env)
    wait_for(lambda: _row(outboxkit_db_url, event_id).get("state") == "succeeded", what="done")
    assert payment_server.requests == 2  # called again with the same idempotency key ...
    assert list(payment_server.charges) == [f"idem-{event_id}"]  # ... charged once
    assert effects(outboxkit_db_url) == [(event_id, "pay-1", 4200)]
    assert _row(outboxkit_db_url, event_id)["attempts"] == 2


def test_sigkill_with_interval_offset_commits_redelivers_and_skips(
    spawn: Callable[..., Worker],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for n, event_id in enumerate(ids):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o-{n}", n)
    args = ("--offset-commit-interval", "600")
    first = spawn(topic, group=group, args=args)
    wait_for(lambda: _row(outboxkit_db_url, ids[-1]).get("state") == "succeeded", what="all")
    first.proc.kill()  # no offset was committed yet
    assert first.wait_exit() == -signal.SIGKILL
    spawn(topic, group=group, args=args)
    for event_id in ids:
        wait_for(
            lambda e=event_id: _row(outboxkit_db_url, e).get("duplicate_count") == 1,
            what=f"duplicate of {event_id}",
        )
    assert [e[0] for e in effects(outboxkit_db_url)] == ids


@pytest.mark.parametrize(
    ("blocked", "driver"),
    [
        pytest.param("confluent_kafka", "aiokafka", id="only-aiokafka"),
        pytest.param("aiokafka", "confluent", id="only-confluent"),
    ],
)
def test_the_consumer_runs_with_only_one_client_library(
    blocked: str,
    driver: str,
    spawner: Callable[..., Worker],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """No --adapter: the consumer picks the installed client (and its driver); a failing event
    still reaches its dead-letter topic through that client."""
    topic = outboxkit_topic()
    dlq = outboxkit_topic(prefix="dlq")
    good, doomed = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, good, "o-1", 10)
    produce_event(outboxkit_kafka_bootstrap, topic, doomed, "fail-1", 1)
    worker = spawner(
        topic,
        group=f"g-{uuid.uuid4().hex[:8]}",
        driver=driver,  # the async handlers run only in the async driver, and vice versa
        client=None,
        without=blocked,
        args=("--max-attempts", "1", "--dead-letter", dlq),
    )
    wait_for(lambda: _row(outboxkit_db_url, doomed).get("state") == "dead", what="dead")
    assert _row(outboxkit_db_url, good)["state"] == "succeeded"
    assert effects(outboxkit_db_url) == [(good, "o-1", 10)]
    [record] = read_topic(outboxkit_kafka_bootstrap, dlq, expect=1)
    assert dict(record.headers())["dlq-event-id"] == doomed.encode()
    assert worker.proc.poll() is None, worker.output()
    assert f"No module named {blocked!r}" not in worker.output()
