"""A relay stopped (SIGTERM) in the middle of a term's first scheduling pass sends nothing more.

Under the parked-key policy ``skip`` the pass brings every held row back (rows held while the
policy was ``wait``, by another holder) before the shard's next claim. A stop ends the pass
between two of its statements, and the worker's loop claims once more before it sees the stop:
that claim may take a newer row of a key whose older rows are still held. It is not sent: in a
new term the producer's life is new, so the claim's topic is checked first, and a stop cuts that
check short; the next holder's first pass brings the rest back first. (A term's later passes
find no held rows under ``skip``: its holder holds none, and no other holder may write while it
holds the lease.) Found by a review; this pins it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from outboxkit.relay.reader import ShardStore
from outboxkit.relay.runner import Relay
from tests.relay_support import (
    KAFKA_CLIENTS,
    SCHEMA,
    insert_rows,
    payloads,
    relay_settings,
    set_shard_count,
)

pytestmark = pytest.mark.integration

KEYS = 2_500  # more than one step of the pass (1,000 keys) walks


def _held_rows(url: str, topic: str) -> None:
    """KEYS keys with one held row each, no parked row: what a switch to 'skip' leaves."""
    columns = "event_id, idempotency_key, content_digest, topic, message_key, payload, state"
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(
            f"INSERT INTO {SCHEMA}.outbox_message ({columns})"
            " SELECT gen_random_uuid(), 'h' || n, '\\x00', %s, 'key-' || lpad(n::text, 4, '0'),"
            " '\\x7b7d', 'held' FROM generate_series(0, %s) n",
            (topic, KEYS - 1),
        )


def _state(url: str, row_id: int) -> str:
    with psycopg.connect(url) as c:
        row = c.execute(f"SELECT state FROM {SCHEMA}.outbox_message WHERE id = %s", (row_id,))
        found = row.fetchone()
    assert found is not None
    return str(found[0])


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_stop_during_the_pass_claims_nothing_more(
    client: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    _held_rows(outboxkit_db_url, topic)
    [newer] = insert_rows(outboxkit_db_url, topic, payloads("key-2000", 1))
    settings = relay_settings(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        client=client,
        mode="at_least_once",
        parked_key_policy="skip",
    )
    relay = Relay(settings)
    schedule = ShardStore.schedule
    steps = 0

    async def stopped_after_one_step(self: ShardStore, *args: Any, **kwargs: Any) -> Any:
        nonlocal steps
        moves = await schedule(self, *args, **kwargs)
        steps += 1
        relay.stop.set()  # SIGTERM while the pass has held keys left to walk
        return moves

    monkeypatch.setattr(ShardStore, "schedule", stopped_after_one_step)
    await asyncio.wait_for(relay.run(), 60)
    assert steps == 1
    assert _state(outboxkit_db_url, newer) == "pending"  # not sent ahead of key-2000's held row
