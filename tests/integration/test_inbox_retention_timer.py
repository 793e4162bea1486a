"""The consumer loop's retention timer against the real database: old finished rows and old
rejections go in small batches, unfinished and recent ones stay."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from sqlalchemy import create_engine

from outboxkit.inbox import Inbox, InboxSettings
from outboxkit.inbox.retention import Purger, Retention
from outboxkit.inbox.steps import drive_sync
from tests.integration.inbox_support import REGISTRY, fetch

pytestmark = pytest.mark.integration


def test_the_purge_timer_deletes_only_old_finished_rows(outboxkit_db_url: str, sa_url: str) -> None:
    consumer = f"r-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        for n in range(5):  # old and finished: purged
            conn.execute(
                "INSERT INTO outboxkit.inbox_message (consumer, event_id, state, finished_at)"
                " VALUES (%s, %s, 'succeeded', now() - interval '10 days')",
                (consumer, f"old-{n}"),
            )
        conn.execute(
            "INSERT INTO outboxkit.inbox_message (consumer, event_id, state, finished_at)"
            " VALUES (%s, 'recent', 'dead', now()), (%s, 'open', 'processing', NULL)",
            (consumer, consumer),
        )
        conn.execute(
            "INSERT INTO outboxkit.inbox_rejection"
            " (consumer, reason, topic, kafka_partition, kafka_offset, created_at)"
            " VALUES (%s, 'old', %s, 0, 0, now() - interval '10 days'),"
            " (%s, 'new', %s, 0, 1, now())",
            (consumer, consumer, consumer, consumer),
        )
    engine = create_engine(sa_url)
    inbox = Inbox(engine, lambda e, c, s: None, InboxSettings(consumer=consumer, registry=REGISTRY))
    try:
        purger = Purger(
            "outboxkit", Retention(7 * 86400, batch_size=2, max_batches=10), 0.0, consumer=consumer
        )
        drive_sync(purger.run_due(0.0), inbox.executor())
    finally:
        inbox.close()
        engine.dispose()
    left = fetch(
        outboxkit_db_url,
        "SELECT event_id FROM outboxkit.inbox_message WHERE consumer = %s ORDER BY 1",
        (consumer,),
    )
    assert left == [("open",), ("recent",)]
    reasons = fetch(
        outboxkit_db_url,
        "SELECT reason FROM outboxkit.inbox_rejection WHERE consumer = %s",
        (consumer,),
    )
    assert reasons == [("new",)]
    assert purger.deleted >= 6  # other tests' old rows may go too
