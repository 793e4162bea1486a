"""An input topic deleted and created again (same name, same partitions) while one of its
records is held for a retry, on the real stack, over both drivers.

The hold refers to a log that no longer exists: every record of the new topic is processed
(each effect once), the held event's row ends ``dead`` saying its record is gone, and nothing
stalls, whether the new topic stays below the held offset or grows past it before the retry.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from outboxkit.inbox import OutcomeKind, RetryPolicy
from tests.integration.inbox_support import (
    Behaviour,
    effects,
    inbox_row,
    inbox_state,
    produce_event,
)
from tests.integration.test_inbox_conformance import adapter, start  # noqa: F401
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
Start = Callable[..., Any]
BEFORE = 3  # records settled before the held one, whose offset is therefore 3


def recreate(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """Delete ``topic`` and create it again with the same name and partition count."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(timeout=30)
    wait_for(
        lambda: topic not in admin.list_topics(timeout=10).topics,
        timeout=30,
        what="the topic deleted",
    )
    deadline = time.monotonic() + 60
    while True:  # a deletion still under way refuses the name for a moment
        try:
            new = NewTopic(topic, num_partitions=partitions, replication_factor=1)
            admin.create_topics([new])[topic].result(timeout=30)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # the broker's own pace: nothing to wait on but trying again


@pytest.mark.parametrize("after", [2, 6], ids=["new-topic-below-held", "new-topic-past-held"])
def test_a_topic_recreated_while_a_record_is_held_loses_nothing(
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    after: int,
) -> None:
    """Before: confluent-kafka skipped the new topic's records below the held offset (their
    effects never happened); both clients left the held event's row ``processing``."""
    topic = outboxkit_topic()
    first = [str(uuid.uuid4()) for _ in range(BEFORE)]
    held = str(uuid.uuid4())
    for i, event_id in enumerate(first):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o-{i}", 1)
    produce_event(outboxkit_kafka_bootstrap, topic, held, "o-held", 1)
    behaviour = Behaviour(fail_attempts=1000, fail_only=held)
    policy = RetryPolicy(initial_delay=12, max_delay=12)  # the recreation takes 1-3 s here
    harness = start([topic], behaviour, policy=policy)
    wait_for(
        lambda: any(o.kind is OutcomeKind.RETRY for o in list(harness.outcomes)),
        timeout=60,
        what="the held event's first failure",
    )
    assert all(inbox_state(outboxkit_db_url, e) == "succeeded" for e in first)
    began = time.monotonic()
    recreate(outboxkit_kafka_bootstrap, topic)
    later = [str(uuid.uuid4()) for _ in range(after)]
    for i, event_id in enumerate(later):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"n-{i}", 2)
    try:
        wait_for(
            lambda: all(inbox_state(outboxkit_db_url, e) == "succeeded" for e in later),
            timeout=90,
            what="every record of the new topic processed",
        )
        wait_for(
            lambda: inbox_state(outboxkit_db_url, held) == "dead",
            timeout=60,
            what="the held event's row ended",
        )
    finally:
        states = {e[:8]: inbox_state(outboxkit_db_url, e) for e in later}
        print(
            f"after {time.monotonic() - began:.1f} s: new records {states},"
            f" held {inbox_state(outboxkit_db_url, held)}, calls {len(behaviour.calls)}"
        )
    done = sorted(e[0] for e in effects(outboxkit_db_url))
    assert done == sorted(first + later)  # each once; the held event's failed runs rolled back
    row = inbox_row(outboxkit_db_url, "billing", held)
    assert row is not None
    assert f"its record ({topic}/0 at offset {BEFORE})" in row["last_error"]
    assert "gone" in row["last_error"] or "left the log" in row["last_error"]
