"""Records the broker refuses for its topic's configuration (``max.message.bytes`` below the
producer's own limit, a record without a key for a compacted topic) keep per-key order in
``at_least_once`` mode: nothing of the parked row's key goes out after it."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from outboxkit.settings import Settings, load_settings
from tests.relay_support import (
    KAFKA_CLIENTS,
    assert_exactly_once_in_order,
    cli_ok,
    consume,
    insert_rows,
    payloads,
    relay_settings,
    running_relay,
    set_shard_count,
    states_by_key,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]

TOPIC_LIMIT = 200_000  # below both producers' limit (1 MB), above aiokafka's own batches here


def _settings(
    db_url: str, bootstrap: str, client: str, batch_bytes: int = 100_000, batch_size: int = 50
) -> Settings:
    base = relay_settings(
        db_url, bootstrap, client=client, mode="at_least_once", batch_size=batch_size
    )
    if client != "confluent":
        return base  # aiokafka's relay batches are 256 KiB: the large record goes alone
    # librdkafka batches up to 1 MB; a smaller batch.size (a user's tuning) puts the large
    # record in a batch of its own, as aiokafka does, so the rows behind it are not refused
    # with it.
    return load_settings(
        overrides={
            "database": {"url": db_url},
            "kafka": {
                "bootstrap": bootstrap,
                "client": client,
                "properties": {"batch.size": str(batch_bytes)},
            },
            "relay": base.relay.model_dump(),
        }
    )


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_record_the_topic_refuses_is_not_overtaken_by_its_key(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    """small, too large for the topic (not for the producer), small, small, of one key: the
    first is published, the large one parked with the broker's reason, the two behind it wait
    and are not on the topic (before, they were sent behind the refused record and overtook it
    for good)."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic(config={"max.message.bytes": str(TOPIC_LIMIT)})
    large = ("k", json.dumps({"k": "k", "n": 1, "pad": "x" * 300_000}).encode())
    rows = [*payloads("k", 1), large, *payloads("k", 2, start=2)]
    for row in rows:
        insert_rows(outboxkit_db_url, topic, [row])
    insert_rows(outboxkit_db_url, topic, payloads("other", 2))
    settings = _settings(outboxkit_db_url, outboxkit_kafka_bootstrap, client)
    async with running_relay(settings):
        await wait_for_async(
            lambda: (
                states_by_key(outboxkit_db_url)
                == {
                    "k": ["published", "parked", "held", "held"],
                    "other": ["published", "published"],
                }
            ),
            what="the large row parked, its key waiting behind it, the other key published",
        )
    [parked] = json.loads(cli_ok(outboxkit_db_url, "outbox", "parked", "--json"))
    assert "toolarge" in parked["reason"].lower().replace("_", ""), parked["reason"]
    got = consume(outboxkit_kafka_bootstrap, topic, expect=3)
    # The first row once (acknowledged before the refusal, it was marked, not sent again);
    # nothing of "k" after the parked row.
    assert [r.value for r in got if r.key == "k"] == [rows[0][1]]
    assert [r.value for r in got if r.key == "other"] == [v for _, v in payloads("other", 2)]


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_keyless_record_for_a_compacted_topic_is_parked_before_it_is_sent(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    """The topic's cleanup.policy says the broker refuses it: it is parked before anything is
    sent, with a reason naming the topic and its policy; the keyed rows go out in order."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic(config={"cleanup.policy": "compact,delete"})
    insert_rows(outboxkit_db_url, topic, payloads("k", 1))
    insert_rows(outboxkit_db_url, topic, [(None, b'{"keyless": true}')])
    insert_rows(outboxkit_db_url, topic, payloads("k", 2, start=1))
    settings = _settings(outboxkit_db_url, outboxkit_kafka_bootstrap, client)
    async with running_relay(settings):
        await wait_for_async(
            lambda: states_by_key(outboxkit_db_url) == {"k": ["published"] * 3, None: ["parked"]},
            what="the keyless row parked, the keyed ones published",
        )
    [parked] = json.loads(cli_ok(outboxkit_db_url, "outbox", "parked", "--json"))
    assert topic in parked["reason"], parked["reason"]
    assert "cleanup.policy=compact,delete" in parked["reason"], parked["reason"]
    got = consume(outboxkit_kafka_bootstrap, topic, expect=3)
    assert [r.value for r in got] == [v for _, v in payloads("k", 3)]


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_small_records_above_the_topic_limit_together_go_in_sends_it_takes(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    """A claim of one key's small rows, together above the topic's limit: a producer batch of
    them all would be refused whole (neither client splits it), and with librdkafka a later
    batch of the same send was accepted before the refused rows went again (overtaken, and
    sent twice). The relay sends them in pieces the topic takes: each once, in order."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic(config={"max.message.bytes": "20000"})
    rows = [("k", json.dumps({"k": "k", "n": n, "pad": "p" * 450}).encode()) for n in range(65)]
    insert_rows(outboxkit_db_url, topic, rows)
    settings = _settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, client, batch_bytes=30_000, batch_size=100
    )
    async with running_relay(settings):
        await wait_for_async(
            lambda: states_by_key(outboxkit_db_url) == {"k": ["published"] * 65},
            what="every row published",
        )
    assert_exactly_once_in_order(consume(outboxkit_kafka_bootstrap, topic, expect=65), rows)
