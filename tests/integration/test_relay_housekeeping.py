"""Housekeeping: the shard holder purges old discarded rows (and old parked rows when asked),
leaving recent ones, pending and published rows alone."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from tests.relay_support import (
    SCHEMA,
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration


def _age(db_url: str, ids: list[int], state: str, hours: float) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {SCHEMA}.outbox_message SET state = %s, parked_reason = 'test',"
            " parked_at = now() - %s * interval '1 hour' WHERE id = ANY(%s)",
            (state, hours, ids),
        )


def _states_by_id(db_url: str) -> dict[int, str]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(f"SELECT id, state FROM {SCHEMA}.outbox_message").fetchall()
    return {int(i): str(s) for i, s in rows}


@pytest.mark.parametrize("parked_retention", [None, 7200.0])
async def test_old_discarded_and_parked_rows_are_purged_in_batches(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Callable[..., str],
    parked_retention: float | None,
) -> None:
    topic = outboxkit_topic()
    old_discarded = insert_rows(outboxkit_db_url, topic, payloads("d", 5))
    new_discarded = insert_rows(outboxkit_db_url, topic, payloads("e", 2))
    old_parked = insert_rows(outboxkit_db_url, topic, payloads("p", 3))
    new_parked = insert_rows(outboxkit_db_url, topic, payloads("q", 1))
    _age(outboxkit_db_url, old_discarded, "discarded", 2)
    _age(outboxkit_db_url, new_discarded, "discarded", 0)
    _age(outboxkit_db_url, old_parked, "parked", 3)
    _age(outboxkit_db_url, new_parked, "parked", 1)
    pending = insert_rows(outboxkit_db_url, topic, payloads("k", 4))
    settings = relay_settings(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        mode="at_least_once",
        retention_seconds="forever",
        retention_batch=2,  # several batches per state
        discarded_retention_seconds=3600,
        parked_retention_seconds=parked_retention,
        housekeeping_interval=0.2,
    )
    async with running_relay(settings) as relay:
        worker = relay.workers[0]
        await wait_for_async(lambda: worker.housekeeping.passes >= 2, what="two sweeps")
        await wait_for_async(
            lambda: row_states(outboxkit_db_url).get("published") == len(pending),
            what="pending rows published",
        )
    states = _states_by_id(outboxkit_db_url)
    assert not set(old_discarded) & states.keys()
    assert all(states[i] == "discarded" for i in new_discarded)
    assert all(states[i] == "parked" for i in new_parked)
    assert all(states[i] == "published" for i in pending)
    if parked_retention is None:  # off by default: parked rows wait for an operator
        assert all(states[i] == "parked" for i in old_parked)
        assert worker.housekeeping.deleted == len(old_discarded)
    else:
        assert not set(old_parked) & states.keys()
        assert worker.housekeeping.deleted == len(old_discarded) + len(old_parked)
