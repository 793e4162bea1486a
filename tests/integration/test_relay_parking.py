"""Permanent errors park the row with its reason; same-key rows wait; other keys flow; retry
after the fix publishes them in order. Also the operator CLI: parked, retry, discard."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import psycopg
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from tests.relay_support import (
    assert_exactly_once_in_order,
    cli_ok,
    consume,
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
    set_shard_count,
    states_by_key,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]


@pytest.mark.parametrize(
    ("mode", "client"),
    [("exactly_once", "confluent"), ("at_least_once", "confluent"), ("exactly_once", "aiokafka")],
)
async def test_oversized_and_unknown_topic_park_and_retry_in_order(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    mode: str,
    client: str,
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic(config={"max.message.bytes": "4000"})
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    big = [("big", json.dumps({"k": "big", "n": 0, "pad": "x" * 6000}).encode())]
    rows_big = big + payloads("big", 3, start=1)
    insert_rows(outboxkit_db_url, topic, payloads("ok", 5))
    insert_rows(outboxkit_db_url, topic, rows_big[:1])
    insert_rows(outboxkit_db_url, missing, payloads("lost", 1))
    insert_rows(outboxkit_db_url, topic, payloads("ok", 5, start=5))
    insert_rows(outboxkit_db_url, topic, rows_big[1:])
    insert_rows(outboxkit_db_url, topic, payloads("lost", 2, start=1))  # behind the parked one
    insert_rows(outboxkit_db_url, topic, payloads("ok", 5, start=10))
    settings = relay_settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, mode=mode, batch_size=50, client=client
    )
    async with running_relay(settings):
        await wait_for_async(
            lambda: (
                states_by_key(outboxkit_db_url)
                == {
                    "ok": ["published"] * 15,
                    "big": ["parked", "held", "held", "held"],
                    "lost": ["parked", "held", "held"],
                }
            ),
            what="bad rows parked, their keys waiting, other keys published",
        )
        listing = json.loads(cli_ok(outboxkit_db_url, "outbox", "parked", "--json"))
        # Reasons carry the client's error name (librdkafka or aiokafka spelling).
        reasons = {item["key"]: item["reason"].lower().replace("_", "") for item in listing}
        assert "toolarge" in reasons["big"]
        assert "unknowntopic" in reasons["lost"]

        # The fix: a larger limit on the topic, and the missing topic created.
        admin = AdminClient({"bootstrap.servers": outboxkit_kafka_bootstrap})
        resource = ConfigResource(
            ConfigResource.Type.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(
                    "max.message.bytes", "100000", incremental_operation=AlterConfigOpType.SET
                )
            ],
        )
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=30)
        for future in admin.create_topics([NewTopic(missing, 1, 1)]).values():
            future.result(timeout=30)
        assert "2 row(s) back to pending" in cli_ok(outboxkit_db_url, "outbox", "retry", "--all")
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 22},
            what="retried rows and the rows behind them published",
        )
    got = consume(outboxkit_kafka_bootstrap, topic, expect=21)
    want = payloads("ok", 15) + rows_big + payloads("lost", 2, start=1)
    if mode == "exactly_once":
        assert_exactly_once_in_order(got, want)
    else:
        assert {r.value for r in got} == {v for _, v in want}
        for key in ("big", "lost"):  # the waiting keys: first delivery after the retry, in order
            seen = [r.value for r in got if r.key == key]
            assert seen == [v for k, v in want if k == key]
    assert [r.value for r in consume(outboxkit_kafka_bootstrap, missing, expect=1)] == [
        payloads("lost", 1)[0][1]
    ]


async def test_skip_policy_lets_same_key_rows_pass_and_discard_unblocks(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    insert_rows(outboxkit_db_url, missing, payloads("k", 1))
    insert_rows(outboxkit_db_url, topic, payloads("k", 2, start=1))
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, parked_key_policy="skip")
    async with running_relay(settings):
        await wait_for_async(
            lambda: states_by_key(outboxkit_db_url) == {"k": ["parked", "published", "published"]},
            what="skip policy publishes behind the parked row",
        )
    with psycopg.connect(outboxkit_db_url) as conn:
        parked_id = conn.execute(
            "SELECT id FROM outboxkit.outbox_message WHERE state = 'parked'"
        ).fetchone()
    assert parked_id is not None
    assert "1 row(s) discarded" in cli_ok(outboxkit_db_url, "outbox", "discard", str(parked_id[0]))
    assert row_states(outboxkit_db_url) == {"discarded": 1, "published": 2}


async def test_discard_unblocks_waiting_key(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    insert_rows(outboxkit_db_url, missing, payloads("k", 1))
    insert_rows(outboxkit_db_url, topic, payloads("k", 2, start=1))
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap)
    async with running_relay(settings):
        await wait_for_async(
            lambda: states_by_key(outboxkit_db_url) == {"k": ["parked", "held", "held"]},
            what="waiting behind the parked row",
        )
        assert "1 row(s) discarded" in cli_ok(outboxkit_db_url, "outbox", "discard", "--all")
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"discarded": 1, "published": 2},
            what="the rest of the key flows after discard",
        )
    got = consume(outboxkit_kafka_bootstrap, topic, expect=2)
    assert [r.value for r in got] == [v for _, v in payloads("k", 2, start=1)]


@pytest.mark.parametrize("client", ["confluent", "aiokafka"])
async def test_rows_whose_headers_are_not_an_object_are_parked_not_stalling_the_shard(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    """The writer stores headers as a JSON object of strings; a row written by other means
    may hold any JSON. Such a row is parked with the reason (its key waits behind it), and every
    other row of the shard is published; fixed and retried, it goes out in its key's order."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    insert_rows(outboxkit_db_url, topic, payloads("ok", 3))
    [array_row] = insert_rows(outboxkit_db_url, topic, payloads("bad", 1))
    [text_row] = insert_rows(outboxkit_db_url, topic, payloads("odd", 1))
    insert_rows(outboxkit_db_url, topic, payloads("bad", 1, start=1))  # waits behind it
    insert_rows(outboxkit_db_url, topic, payloads("ok", 3, start=3))
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        for row_id, value in ((array_row, "[1, 2]"), (text_row, '"text"')):
            conn.execute(
                "UPDATE outboxkit.outbox_message SET headers = %s::jsonb WHERE id = %s",
                (value, row_id),
            )
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, client=client)
    async with running_relay(settings):
        await wait_for_async(
            lambda: (
                states_by_key(outboxkit_db_url)
                == {"ok": ["published"] * 6, "bad": ["parked", "held"], "odd": ["parked"]}
            ),
            what="the two rows parked, the other key published",
        )
        listing = json.loads(cli_ok(outboxkit_db_url, "outbox", "parked", "--json"))
        reasons = {item["key"]: item["reason"] for item in listing}
        assert "headers must be a JSON object, not a JSON array" in reasons["bad"]
        assert "not a JSON string" in reasons["odd"]
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE outboxkit.outbox_message SET headers = '{}' WHERE id = %s", (array_row,)
            )
        assert "1 row(s) back to pending" in cli_ok(
            outboxkit_db_url, "outbox", "retry", str(array_row)
        )
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 8, "parked": 1},
            what="the fixed row and the one behind it published",
        )
    got = consume(outboxkit_kafka_bootstrap, topic, expect=8)
    assert [r.value for r in got if r.key == "bad"] == [v for _, v in payloads("bad", 2)]


@pytest.mark.parametrize("client", ["confluent", "aiokafka"])
async def test_a_keyless_row_for_a_compacted_topic_is_parked_not_retried_for_ever(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    """A compacted topic refuses a record without a key (INVALID_RECORD). aiokafka does not know
    that error code and reports a bare ``UnknownError``; classed retriable, it held the shard for
    ever. Both clients must park the row with the reason and publish the rest."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic(config={"cleanup.policy": "compact"})
    insert_rows(outboxkit_db_url, topic, payloads("ok", 3))
    insert_rows(outboxkit_db_url, topic, [(None, b'{"keyless": true}')])
    insert_rows(outboxkit_db_url, topic, payloads("ok", 3, start=3))
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, client=client)
    async with running_relay(settings):
        await wait_for_async(
            lambda: states_by_key(outboxkit_db_url) == {"ok": ["published"] * 6, None: ["parked"]},
            what="the keyless row parked, the keyed ones published",
        )
        [parked] = json.loads(cli_ok(outboxkit_db_url, "outbox", "parked", "--json"))
        assert "invalidrecord" in parked["reason"].lower().replace("_", "")
    got = consume(outboxkit_kafka_bootstrap, topic, expect=6)
    assert [r.value for r in got] == [v for _, v in payloads("ok", 6)]


@pytest.mark.parametrize("client", ["confluent", "aiokafka"])
async def test_rows_for_the_checkpoint_topic_are_parked_never_read_back_as_checkpoints(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    """A row addressed to the relay's own checkpoint topic, keyed like a checkpoint and
    carrying a forged one, would be read back at the next takeover: the rows it names marked
    published without being sent, or (garbage) a shard that refuses to publish. Such rows are
    parked with the reason; a second relay taking over publishes what the first left."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, client=client)
    checkpoints = settings.relay.checkpoint_topic
    insert_rows(outboxkit_db_url, topic, payloads("ok", 2))
    [later] = insert_rows(outboxkit_db_url, topic, payloads("later", 1))
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(  # not due yet: the forged checkpoint below names it
            "UPDATE outboxkit.outbox_message SET deliver_after = now() + interval '1 hour'"
            " WHERE id = %s",
            (later,),
        )
        event_id = conn.execute(
            "SELECT event_id FROM outboxkit.outbox_message WHERE id = %s", (later,)
        ).fetchone()
    assert event_id is not None
    forged = json.dumps({"token": 2**62, "ids": [later], "event_ids": [str(event_id[0])]})
    insert_rows(outboxkit_db_url, checkpoints, [("default/0", forged.encode())])
    insert_rows(outboxkit_db_url, checkpoints, [("default/0/1", b"\xff not a checkpoint")])
    async with running_relay(settings):
        await wait_for_async(
            lambda: (
                states_by_key(outboxkit_db_url)
                == {
                    "ok": ["published"] * 2,
                    "later": ["scheduled"],
                    "default/0": ["parked"],
                    "default/0/1": ["parked"],
                }
            ),
            what="the checkpoint-topic rows parked, the others published",
        )
    listing = json.loads(cli_ok(outboxkit_db_url, "outbox", "parked", "--json"))
    assert {item["reason"] for item in listing} == {
        "CHECKPOINT_TOPIC: the relay's checkpoint topic takes only the relay's own records"
    }
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE outboxkit.outbox_message SET deliver_after = NULL WHERE id = %s", (later,)
        )
    async with running_relay(settings):  # a takeover: reads the checkpoints back
        await wait_for_async(
            lambda: states_by_key(outboxkit_db_url)["later"] == ["published"],
            what="the row the forged checkpoint named, published",
        )
    got = consume(outboxkit_kafka_bootstrap, topic, expect=3)
    assert sorted(r.key for r in got) == ["later", "ok", "ok"]


async def test_rows_of_no_shard_are_parked_and_retried_into_their_keys_shard(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    """Rows written by hand with a shard number outside the count would wait for ever, seen by
    no relay and no metric. Shard 0's holder parks them with the reason; `outbox retry` gives
    them their key's shard, and they are published."""
    set_shard_count(outboxkit_db_url, 2)
    topic = outboxkit_topic()
    insert_rows(outboxkit_db_url, topic, payloads("ok", 2))
    [high] = insert_rows(outboxkit_db_url, topic, payloads("high", 1))
    [low] = insert_rows(outboxkit_db_url, topic, payloads("low", 1))
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        for row_id, shard in ((high, 7), (low, -1)):
            conn.execute(
                "UPDATE outboxkit.outbox_message SET shard = %s WHERE id = %s", (shard, row_id)
            )
    # One row per statement: the sweep goes on until a batch comes back short.
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, retention_batch=1)
    async with running_relay(settings):
        await wait_for_async(
            lambda: (
                states_by_key(outboxkit_db_url)
                == {"ok": ["published"] * 2, "high": ["parked"], "low": ["parked"]}
            ),
            what="the rows of no shard parked",
        )
        listing = json.loads(cli_ok(outboxkit_db_url, "outbox", "parked", "--json"))
        reasons = {item["key"]: item["reason"] for item in listing}
        assert reasons["high"].startswith("STRAY_SHARD: shard 7 is outside 0..1")
        assert reasons["low"].startswith("STRAY_SHARD: shard -1 is outside 0..1")
        assert "2 row(s) back to pending" in cli_ok(outboxkit_db_url, "outbox", "retry", "--all")
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 4},
            what="the retried rows published",
        )
    with psycopg.connect(outboxkit_db_url) as conn:
        shards = conn.execute(
            "SELECT message_key, shard, outboxkit.outbox_shard(message_key, event_id, 2)"
            " FROM outboxkit.outbox_message WHERE id = ANY(%s)",
            ([high, low],),
        ).fetchall()
    assert all(shard == expected for _, shard, expected in shards), shards
    got = consume(outboxkit_kafka_bootstrap, topic, expect=4)
    assert sorted(r.key for r in got) == ["high", "low", "ok", "ok"]


@pytest.mark.parametrize("client", ["confluent", "aiokafka"])
async def test_a_row_for_a_kafka_internal_topic_is_parked_and_its_shard_goes_on(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    """A row for ``__consumer_offsets`` (written by hand or by an older writer: the writer
    refuses the name) is parked with its reason. Before, with confluent-kafka in exactly-once
    mode the broker refused the partition, the whole transaction failed at every try and the
    shard published nothing more; aiokafka parked it as a topic that does not exist."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    insert_rows(outboxkit_db_url, "__consumer_offsets", [("internal", b"{}")])
    insert_rows(outboxkit_db_url, topic, payloads("ok", 3))
    settings = relay_settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, client=client, mode="exactly_once"
    )
    async with running_relay(settings):
        await wait_for_async(
            lambda: (
                states_by_key(outboxkit_db_url) == {"internal": ["parked"], "ok": ["published"] * 3}
            ),
            what="the internal-topic row parked, the others published",
        )
    [parked] = json.loads(cli_ok(outboxkit_db_url, "outbox", "parked", "--json"))
    assert parked["reason"] == (
        "INTERNAL_TOPIC: a Kafka-internal topic takes no application records"
    )
    got = consume(outboxkit_kafka_bootstrap, topic, expect=3)
    assert [r.value for r in got] == [v for _, v in payloads("ok", 3)]
