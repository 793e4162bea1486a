"""Rows the writer would not produce, and rows a client refuses: one such row is parked with its
reason; it neither stalls its shard nor lets a later row of its key overtake it."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg
import pytest

from outboxkit.kafka import KafkaClients
from outboxkit.kafka.api import ProduceRequest
from outboxkit.kafka.errors import ErrorKind
from outboxkit.settings import KafkaClient, KafkaSettings
from tests.relay_support import (
    KAFKA_CLIENTS,
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
# Deeper than Python's json decodes (its recursion limit); PostgreSQL's jsonb takes it.
DEEP_HEADERS = '{"a": ' + "[" * 2000 + "]" * 2000 + "}"
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_row_whose_headers_nest_too_deeply_is_parked_not_stalling_the_shard(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    """psycopg decoded the headers jsonb while fetching the claim; Python's json gives up on
    deep nesting (RecursionError), so every claim of the shard failed and was retried for ever.
    Now the row alone is parked with the reason, its key waits, every other row is published
    (headers of its own included); fixed and retried, it goes out in its key's order."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    insert_rows(outboxkit_db_url, topic, payloads("ok", 2), headers=TRACE)
    [deep_row] = insert_rows(outboxkit_db_url, topic, payloads("deep", 1))
    insert_rows(outboxkit_db_url, topic, payloads("deep", 1, start=1))  # waits behind it
    insert_rows(outboxkit_db_url, topic, payloads("ok", 2, start=2))
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE outboxkit.outbox_message SET headers = CAST(%s AS jsonb) WHERE id = %s",
            (DEEP_HEADERS, deep_row),
        )
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, client=client)
    async with running_relay(settings):
        await wait_for_async(
            lambda: (
                states_by_key(outboxkit_db_url)
                == {"ok": ["published"] * 4, "deep": ["parked", "held"]}
            ),
            what="the deep row parked, the other key published",
        )
        listing = json.loads(cli_ok(outboxkit_db_url, "outbox", "parked", "--json"))
        assert [item["id"] for item in listing] == [deep_row]
        assert "nested too deeply" in listing[0]["reason"]
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE outboxkit.outbox_message SET headers = CAST(%s AS jsonb) WHERE id = %s",
                (json.dumps(TRACE), deep_row),
            )
        assert "1 row(s) back to pending" in cli_ok(outboxkit_db_url, "outbox", "retry", "--all")
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 6},
            what="the fixed row and the one behind it published",
        )
    got = consume(outboxkit_kafka_bootstrap, topic, expect=6)
    assert [r.value for r in got if r.key == "deep"] == [v for _, v in payloads("deep", 2)]
    traced = [r for r in got if r.key == "ok"][:2] + [r for r in got if r.key == "deep"][:1]
    assert all(r.headers["traceparent"] == TRACE["traceparent"] for r in traced)


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_at_least_once_a_row_refused_before_sending_is_not_overtaken_by_its_key(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    """Row X of key K is larger than the client's size limit and is refused before it is sent;
    outside a transaction the next row of K, produced in the same call, was acknowledged and
    could not be taken back: K read "Y" while X was parked, and "Y" again once X was dealt with.
    Now nothing after X is produced in that call: K reads nothing until X is discarded, then Y
    once."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    big = json.dumps({"k": "K", "n": 0, "pad": "x" * 1_200_000}).encode()
    with psycopg.connect(outboxkit_db_url) as conn:  # one transaction: one claim carries all
        insert_rows(conn, topic, payloads("ok", 1))
        [big_row] = insert_rows(conn, topic, [("K", big)])
        insert_rows(conn, topic, payloads("K", 1, start=1))
        insert_rows(conn, topic, payloads("ok", 1, start=1))
        conn.commit()
    settings = relay_settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, client=client, mode="at_least_once"
    )
    async with running_relay(settings):
        await wait_for_async(
            lambda: (
                states_by_key(outboxkit_db_url)
                == {"ok": ["published"] * 2, "K": ["parked", "held"]}
            ),
            what="the large row parked, the row of its key waiting, the other key published",
        )
        early = consume(outboxkit_kafka_bootstrap, topic, expect=2)
        assert [r.value for r in early if r.key == "K"] == []  # nothing overtook the parked row
        assert {r.value for r in early} == {v for _, v in payloads("ok", 2)}
        assert "1 row(s) discarded" in cli_ok(outboxkit_db_url, "outbox", "discard", str(big_row))
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 3, "discarded": 1},
            what="the row behind the discarded one published",
        )
    got = consume(outboxkit_kafka_bootstrap, topic, expect=3)
    assert [r.value for r in got if r.key == "K"] == [v for _, v in payloads("K", 1, start=1)]


@pytest.mark.parametrize("transactional", [False, True])
@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_record_refused_before_it_is_sent_stops_the_send(
    outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory, client: str, transactional: bool
) -> None:
    """The producer seam: a record above the request size (both clients cap a request at
    1 MiB) is refused before it is sent; what came before it goes out, nothing after it is
    produced (a retriable NOT_SENT each), so no later record of its key can overtake it."""
    topic = outboxkit_topic()
    kafka = KafkaClients(
        KafkaSettings(bootstrap=outboxkit_kafka_bootstrap, client=KafkaClient(client)), timeout=15
    )
    producer = kafka.transactional_producer(f"hostile-{topic}" if transactional else None)
    requests = [
        ProduceRequest(topic, b"k", b"k-0"),
        ProduceRequest(topic, b"k", b"x" * (1024 * 1024 + 1)),
        ProduceRequest(topic, b"k", b"k-1"),
        ProduceRequest(topic, b"other", b"other-0"),
    ]
    try:
        await producer.start()
        if transactional:
            await producer.begin()
        deliveries = await producer.send(requests)
        if transactional:
            await producer.abort()
    finally:
        await producer.close()
    errors = [d.error for d in deliveries]
    assert errors[0] is None
    assert errors[1] is not None
    assert errors[1].kind is ErrorKind.PERMANENT, errors[1]
    assert [e.name if e else None for e in errors[2:]] == ["NotSent", "NotSent"]
    assert all(e.kind is ErrorKind.RETRIABLE for e in errors[2:] if e)
    got = consume(outboxkit_kafka_bootstrap, topic, expect=0 if transactional else 1, quiet=1.0)
    assert [r.value for r in got] == ([] if transactional else [b"k-0"])
