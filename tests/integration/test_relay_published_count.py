"""``outboxkit_relay_published_total`` counts each row once, also when its mark failed.

A batch whose database mark fails is marked by the next term's reconciliation from its
checkpoint. The counter went up at the Kafka commit and again at the reconciliation, so it
said 20 for 10 rows; it now counts rows as they are marked.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from outboxkit.relay.metrics import RelayMetrics
from tests.relay_support import (
    KAFKA_CLIENTS,
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
    set_shard_count,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

FAIL_FIRST_MARK = """
CREATE SEQUENCE public.marks_seen;
CREATE FUNCTION public.fail_first_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'published' AND OLD.state = 'pending'
       AND nextval('public.marks_seen') = 1 THEN
        RAISE EXCEPTION 'the first mark fails (test)';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fail_first_mark BEFORE UPDATE ON outboxkit.outbox_message
    FOR EACH ROW EXECUTE FUNCTION public.fail_first_mark();
"""


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_batch_whose_mark_failed_is_counted_once(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Callable[..., str],
    client: str,
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(FAIL_FIRST_MARK)
    insert_rows(outboxkit_db_url, outboxkit_topic(), payloads("a", 10))
    settings = relay_settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, client=client, mode="exactly_once"
    )
    metrics = RelayMetrics()
    async with running_relay(settings, metrics=metrics):
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 10}, what="all published"
        )
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        seen = conn.execute("SELECT last_value FROM public.marks_seen").fetchone()
    assert seen is not None
    assert seen[0] > 1  # the first mark failed, a later statement marked the rows
    counted = metrics.registry.get_sample_value("outboxkit_relay_published_total", {"shard": "0"})
    assert counted == 10
