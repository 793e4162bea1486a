"""``outboxkit inbox run`` stopped (SIGTERM) while Kafka is away (killed): it ends at once, with
status 0 and without a traceback, whether or not offsets are still to be committed, and while a
dead letter waits for Kafka (the record is held; the next start publishes its dead letter).

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
from pathlib import Path

import pytest

from outboxkit.devstack import DevStack
from tests.fault.inbox_workers import Worker
from tests.integration.inbox_support import fetch, produce_event
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]
# Seconds. Before, aiokafka with offsets to commit did not end until Kafka came back. With
# offsets to commit, librdkafka's commit fails once the group session timed out (6 s here),
# aiokafka's once no coordinator was known for 2 s.
STOPPED_WITHIN = 20.0
# What each client logs once it has noticed the broker is gone (aiokafka: a fetch failed, so
# one is in its retry back-off, which made its stop raise before).
# What each client logs once it finds the broker gone (librdkafka says it in several ways, in
# an order that varies: the connection's end, a failed reconnect, or all brokers down).
AWAY = {
    "aiokafka": ("Failed fetch messages",),
    "confluent": ("Connect to ipv4", "Disconnected", "brokers are down", "Connection refused"),
}


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
    adapter: str,
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
    took = _stopped_while_away(worker, outboxkit_stack, adapter, lambda: None)
    assert took < STOPPED_WITHIN, f"{took:.1f} s\n{worker.output()}"
    assert "Unclosed" not in worker.output(tail=1_000_000), worker.output()


def _stopped_while_away(
    worker: Worker, stack: DevStack, adapter: str, then: Callable[[], None], notices: bool = True
) -> float:
    """Kill Kafka, wait until the consumer noticed (if it ``notices``: it logs it), ``then()``,
    SIGTERM: the seconds to its end.

    Killed, not stopped: a single broker's controlled shutdown answers metadata with no leader
    for a moment (measured), and an aiokafka consumer whose metadata refresh lands then sends
    no more fetches and logs nothing while the broker is away, so the fetch failure this waits
    for never came (once in CI). A killed broker answers nothing, so a fetch fails."""
    assert stack.kafka is not None
    seen = worker.log.stat().st_size
    stack.kafka.kill()
    try:
        new = lambda: worker.log.read_bytes()[seen:].decode(errors="replace")  # noqa: E731
        if notices:
            wait_for(
                lambda: any(said in new() for said in AWAY[adapter]),
                what="the consumer noticing Kafka away",
            )
        then()
        began = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        code = worker.wait_exit(timeout=120)
        took = time.monotonic() - began
    finally:
        stack.kafka.start()
    log = worker.output(tail=1_000_000)
    assert code == 0, log
    assert "Traceback" not in log, log
    return took


def test_sigterm_during_a_dead_letter_while_kafka_is_away_leaves_it_for_the_next_start(
    spawn: Callable[..., Worker],
    outboxkit_stack: DevStack,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    adapter: str,
    tmp_path: Path,
) -> None:
    if outboxkit_stack.kafka is None:
        pytest.skip("external Kafka: cannot stop it")
    topic, dlq, event = outboxkit_topic(), outboxkit_topic(prefix="dlq"), str(uuid.uuid4())
    release = tmp_path / "release"
    produce_event(outboxkit_kafka_bootstrap, topic, event, "held-1", 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    options = {
        "group": group,
        "args": ("--max-attempts", "1", "--dead-letter", dlq),
        "extra_env": {"APP_RELEASE_FILE": str(release)},
    }
    worker = spawn(topic, **options)
    wait_for(lambda: _state(outboxkit_db_url, event) == "processing", what="its handler running")
    # Released once Kafka is away: the handler fails, its only attempt, and the dead letter
    # waits for Kafka when the SIGTERM comes.
    # (A confluent-kafka consumer's thread is in the handler: librdkafka's lines reach the log
    # only through its poll.)
    notices = adapter == "aiokafka"
    took = _stopped_while_away(worker, outboxkit_stack, adapter, release.touch, notices)
    assert took < STOPPED_WITHIN, f"{took:.1f} s\n{worker.output()}"
    assert _state(outboxkit_db_url, event) == "processing"  # not dead without its dead letter
    spawn(topic, **options)
    wait_for(lambda: _state(outboxkit_db_url, event) == "dead", what="the event dead-lettered")
    records = read_topic(outboxkit_kafka_bootstrap, dlq, expect=1)
    headers = [dict(r.headers()) for r in records]
    assert [h["dlq-event-id"] for h in headers] == [event.encode()]
    assert b"payment provider gave up" in headers[0]["dlq-error"]  # the handler's own error
