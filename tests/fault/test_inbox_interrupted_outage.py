"""PostgreSQL stopped while a handler runs, records handled one by one with
``max_attempts=1``: the run is interrupted and its claim cannot even be given back (the server
is gone). The give-back is owed and made before the event is claimed again, so the event still
succeeds with ``attempts = 1``. Without it the next claim, a takeover, counted the interrupted
run: ``attempts exhausted``, the event ``dead`` without its handler having run again."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from outboxkit.devstack import DevStack
from outboxkit.inbox import RetryPolicy
from tests.integration.inbox_support import Harness, effects, inbox_row, produce_event
from tests.integration.test_inbox_conformance import adapter, start  # noqa: F401
from tests.integration.test_inbox_interrupted_run import ONE_BY_ONE, HeldOnce
from tests.support.waiting import wait_for

TopicFactory = Callable[..., str]
Start = Callable[..., Harness]


def test_a_run_interrupted_by_a_postgres_stop_is_no_attempt(
    start: Start,  # noqa: F811
    outboxkit_stack: DevStack,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if outboxkit_stack.postgres is None:
        pytest.skip("external PostgreSQL: cannot stop it")
    topic, event_id, behaviour = outboxkit_topic(), str(uuid.uuid4()), HeldOnce()
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o-1", 1)
    harness = start(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=1),
        dead_letter=outboxkit_topic(prefix="dlq"),
        consumer_options=ONE_BY_ONE,
    )
    assert behaviour.started.wait(60), "the handler never ran"
    outboxkit_stack.postgres.stop()
    try:
        behaviour.go.set()  # its mark, then the give-back, fail: the server is gone
        failed = f"processing {topic}/0/0 failed"  # after the give-back was tried
        wait_for(lambda: failed in caplog.text, what="the interrupted run retried")
    finally:
        outboxkit_stack.postgres.start()
    harness.wait_outcomes(event_id)
    row = inbox_row(outboxkit_db_url, "billing", event_id)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("succeeded", 1), row["last_error"]
    assert len(effects(outboxkit_db_url, event_id)) == 1
    assert "not given back yet" in caplog.text
