"""A backlog of published rows past ``retention_seconds`` (retention just turned on, a window
lowered) is deleted over many short passes, with the shard publishing between them.

Before, one pass deleted until nothing was left, inline in the shard's loop: the shard
published nothing meanwhile (1.5 million expired rows: 16 s, 3 million: 37 s). The test writes
new rows once the deleting has begun and checks that they are published while expired rows are
still left; before, they waited for the last of them.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from tests.relay_support import (
    insert_rows,
    payloads,
    relay_settings,
    running_relay,
    set_shard_count,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
EXPIRED = 200_000

_FILL = """
INSERT INTO outboxkit.outbox_message
    (event_id, idempotency_key, content_digest, topic, message_key, payload, shard, state,
     published_at)
SELECT gen_random_uuid(), 'old-' || g, '\\x00', %(topic)s, 'old', '\\x7b7d', 0, 'published',
       now() - interval '2 days'
FROM generate_series(1, %(rows)s) AS g
"""


def _count(db_url: str, where: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(f"SELECT count(*) FROM outboxkit.outbox_message WHERE {where}")
        return int(row.fetchone()[0])  # type: ignore[index]


async def test_new_rows_are_published_while_expired_rows_are_still_being_deleted(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 1)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(_FILL, {"topic": topic, "rows": EXPIRED})
        conn.execute("VACUUM ANALYZE outboxkit.outbox_message")
    # Small statements, so deleting them all takes far longer than one pass's time.
    settings = relay_settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, retention_seconds=3600, retention_batch=20
    )
    old = "message_key = 'old'"
    async with running_relay(settings):
        await wait_for_async(lambda: _count(outboxkit_db_url, old) < EXPIRED, what="deletes")
        insert_rows(outboxkit_db_url, topic, payloads("new", 5))
        new_published = "message_key = 'new' AND state = 'published'"
        await wait_for_async(lambda: _count(outboxkit_db_url, new_published) == 5, what="new")
        left = _count(outboxkit_db_url, old)
        assert left > 0, "the new rows waited for the whole backlog"
