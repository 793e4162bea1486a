"""``outboxkit inbox run`` started while Kafka is away: it waits with back-off (its start-up check
of the dead-letter topics, or, with aiokafka, joining the group) instead of exiting, and a
SIGTERM meanwhile ends it at once.

Before, both clients' start-up check waited on until Kafka answered whatever signal came (the
stop event reached the check only once ``run()`` had begun, after the start-up; confluent-kafka's
metadata read also held the process for its whole timeout), and aiokafka's
``inbox run`` exited with status 1 when it could not join the group: a crash loop under a
supervisor, where the relay waits with back-off. Nothing listens on the Kafka port here.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from outboxkit.devstack.process import free_port
from tests.fault.test_secured_kafka import ROOT, Processes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

STOPPED_WITHIN = 20.0  # seconds; the stop ends a wait at once, and before, it never ended


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    running = Processes(tmp_path)
    yield running
    running.stop()


STARTING = "consumer billing starting"  # said once a SIGTERM is handled


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose connections are accepted (the kernel's backlog) and never answered, like a
    broker behind a firewall that drops packets: a client's request waits its whole timeout."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


@pytest.mark.parametrize(
    ("client", "check", "kafka", "waiting"),
    [
        # Its check's metadata read waits up to the Kafka timeout (30 s) before the check says
        # it waits: the stop comes once the process said it starts (the stop handled).
        ("confluent", "fail", "refused", STARTING),
        ("aiokafka", "fail", "refused", "waiting for Kafka before checking topic"),
        ("aiokafka", "off", "refused", "Kafka consumer could not start"),
        # A Kafka that never answers holds a question (or aiokafka's join) for its timeout.
        ("confluent", "fail", "silent", STARTING),
        ("aiokafka", "fail", "silent", STARTING),
        ("aiokafka", "off", "silent", STARTING),
    ],
)
def test_inbox_run_waits_for_kafka_and_stops_at_once(
    outboxkit_db_url: str,
    processes: Processes,
    silent_port: int,
    client: str,
    check: str,
    kafka: str,
    waiting: str,
) -> None:
    port = silent_port if kafka == "silent" else free_port()  # free: nothing listens there
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXKIT_")}
    env.update(
        OUTBOXKIT_DATABASE_URL=outboxkit_db_url,
        OUTBOXKIT_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}",
        OUTBOXKIT_KAFKA_CLIENT=client,
        OUTBOXKIT_CONSUMER_NAME="billing",
        OUTBOXKIT_CONSUMER_GROUP=f"g-{uuid.uuid4().hex[:8]}",
        OUTBOXKIT_CONSUMER_TOPICS="payments",
        PYTHONPATH=str(ROOT),
    )
    registry = "SYNC" if client == "confluent" else "ASYNC"
    args = ["inbox", "run", "--registry", f"tests.fault.consumer_app:{registry}"]
    index = processes.start(["-v", *args, "--dead-letter-check", check], env)
    proc = processes.procs[index][0]
    wait_for(
        lambda: waiting in processes.output(index) or proc.poll() is not None,
        timeout=60,
        what=f"inbox run waiting for Kafka; {processes.output(index)}",
    )
    assert proc.poll() is None, f"it ended instead of waiting:\n{processes.output(index)}"
    if check == "off" and kafka == "refused":
        assert "retrying in" in processes.output(index)
    proc.terminate()
    assert proc.wait(STOPPED_WITHIN) == 0, processes.output(index)
    assert "Traceback" not in processes.output(index)
