"""A consumer frozen between its ``succeeded`` mark and its COMMIT (SIGSTOP here; a VM paused,
a network partition that sends no reset) no longer holds up the next owner for as long as it
stays frozen.

Its session sat idle in its transaction with the marked rows locked, and the new owner's claim
of them waited on those locks, with every other partition of that member behind it: for the
whole freeze, or after a partition until TCP keepalive ended the session (about two hours by
default). The mark now sets ``idle_in_transaction_session_timeout`` for the rest of its
transaction (10 s, or the session's own when shorter): the server ends the frozen session,
its transaction rolls back, and the new owner's claim goes through.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest

from outboxkit.inbox.store import QUIET_AFTER_MARK_SECONDS
from tests.fault.inbox_workers import Worker
from tests.integration.inbox_support import effects, inbox_row, produce_event
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]


def _frozen_in_its_transaction(db_url: str) -> bool:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
            " AND query LIKE '%inbox_message%succeeded%'"
        ).fetchone()
        return row is not None and row[0] > 0


def test_a_consumer_frozen_after_its_mark_holds_up_the_next_owner_for_a_bounded_time(
    spawn: Callable[..., Worker],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    group = f"g-{uuid.uuid4().hex[:8]}"
    event_id = str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o-1", 1)
    frozen = spawn(topic, group=group, fault="before_db_commit:1:stop")
    try:
        wait_for(lambda: _frozen_in_its_transaction(outboxkit_db_url), what="the frozen mark")
        began = time.monotonic()
        spawn(topic, group=group)
        wait_for(
            lambda: (
                (inbox_row(outboxkit_db_url, "billing", event_id) or {}).get("state") == "succeeded"
            ),
            timeout=120,
            what="the next owner's success",
        )
        took = time.monotonic() - began
        assert frozen.running()  # still frozen: the server, not its end, let the next one on
        assert len(effects(outboxkit_db_url, event_id)) == 1
        # The group notices the frozen member after its session timeout (6 s), and the server
        # ends its session QUIET_AFTER_MARK_SECONDS after it went quiet; before, never.
        assert took < 90, took
        assert took >= QUIET_AFTER_MARK_SECONDS - 2, took
    finally:
        frozen.proc.send_signal(signal.SIGKILL)
        frozen.proc.wait(30)
