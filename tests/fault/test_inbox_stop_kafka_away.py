"""``outboxkit inbox run`` stopped (SIGTERM) while Kafka is away: it ends at once, with status 0
and without a traceback, whether or not offsets are still to be committed.

Before, with aiokafka: the consumer's stop raised a fetch's cancellation (a fetch cancelled
in its retry back-off), so the process exited with status 1, a traceback and an unclosed
producer; with offsets still to commit, the close's commit waited for a group coordinator until
Kafka came back, and the process did not end.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable

import pytest

from outboxkit.devstack import DevStack
from tests.fault.inbox_workers import Worker
from tests.integration.inbox_support import fetch, produce_event
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]
# Seconds. Before, aiokafka with offsets to commit did not end until Kafka came back. With
# offsets to commit, librdkafka's commit fails once the group session timed out: 6 s here.
STOPPED_WITHIN = 20.0
# What each client logs once it has noticed the broker is gone.
AWAY = ("Failed fetch messages", "Connect to ipv4", "Disconnected", "coordinator dead")


def _state(db_url: str, event_id: str) -> str | None:
    query = "SELECT state FROM outboxkit.inbox_message WHERE event_id = %s"
    rows = fetch(db_url, query, (event_id,))
    return rows[0][0] if rows else None


@pytest.mark.parametrize(
    "interval", [pytest.param("0", id="committed"), pytest.param("600", id="offsets-pending")]
)
def test_sigterm_while_kafka_is_away_ends_the_consumer_cleanly(
    spawn: Callable[..., Worker],
    outboxkit_stack: DevStack,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    interval: str,
) -> None:
    if outboxkit_stack.kafka is None:
        pytest.skip("external Kafka: cannot stop it")
    topic, event = outboxkit_topic(), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, event, "o-1", 1)
    worker = spawn(
        topic,
        group=f"g-{uuid.uuid4().hex[:8]}",
        extra_env={"OUTBOXKIT_CONSUMER_OFFSET_COMMIT_INTERVAL": interval},
    )
    wait_for(lambda: _state(outboxkit_db_url, event) == "succeeded", what="the event applied")
    seen = worker.log.stat().st_size
    outboxkit_stack.kafka.stop()
    try:
        new = lambda: worker.log.read_bytes()[seen:].decode(errors="replace")  # noqa: E731
        wait_for(lambda: any(a in new() for a in AWAY), what="the consumer noticing Kafka away")
        began = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        code = worker.wait_exit(timeout=120)
        took = time.monotonic() - began
    finally:
        outboxkit_stack.kafka.start()
    log = worker.output(tail=1_000_000)
    assert code == 0, log
    assert took < STOPPED_WITHIN, f"{took:.1f} s\n{log}"
    assert "Traceback" not in log, log
    assert "Unclosed" not in log, log
