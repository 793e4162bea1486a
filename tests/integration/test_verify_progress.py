"""``outboxkit verify``'s drain reads the run's outbox rows by state: rows the relay moved out of
its claims' way ('held' behind a parked row of their key, 'scheduled' for later) are still to be
sent and keep it waiting; parked rows are not expected at the consumers. Before, only 'pending'
rows kept it waiting, so a drain ended with held or scheduled rows unsent."""

from __future__ import annotations

import psycopg
import pytest

from outboxkit.verify.collect import progress

pytestmark = pytest.mark.integration

SCHEMA = "outboxkit"
TOPIC = "verify.orders"
CONSUMERS = ["verify-confluent", "verify-aiokafka"]


def _row(conn: psycopg.Connection, name: str, state: str, topic: str = TOPIC) -> None:
    conn.execute(
        f"INSERT INTO {SCHEMA}.outbox_message (event_id, idempotency_key, content_digest, topic,"
        " message_key, payload, state, deliver_after)"
        " VALUES (gen_random_uuid(), %s, '\\x00', %s, 'k', '\\x7b7d', %s,"
        " CASE WHEN %s = 'scheduled' THEN now() + interval '1 day' END)",
        (name, topic, state, state),
    )


def _settle(conn: psycopg.Connection, event: str) -> None:
    for consumer in CONSUMERS:
        conn.execute(
            f"INSERT INTO {SCHEMA}.inbox_message (consumer, event_id, state, finished_at)"
            " VALUES (%s, %s, 'succeeded', now())",
            (consumer, event),
        )


def _drained(url: str) -> bool:
    return progress(url, SCHEMA, [TOPIC], CONSUMERS).drained


@pytest.mark.parametrize("waiting", ["held", "scheduled", "pending"])
def test_rows_still_to_be_sent_keep_the_drain_waiting(outboxkit_db_url: str, waiting: str) -> None:
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        _row(conn, "sent", "published")
        _settle(conn, "sent")
        _row(conn, "given-up", "parked")
        _row(conn, "elsewhere", waiting, topic="another.run")  # another run's row: not counted
        assert _drained(outboxkit_db_url)
        _row(conn, "behind", waiting)
        assert not _drained(outboxkit_db_url)
        conn.execute(
            f"UPDATE {SCHEMA}.outbox_message SET state = 'published' WHERE idempotency_key = %s",
            ("behind",),
        )
        assert not _drained(outboxkit_db_url)  # sent, not yet settled by the consumers
        _settle(conn, "behind")
        assert _drained(outboxkit_db_url)
