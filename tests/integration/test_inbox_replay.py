"""``outboxkit inbox replay`` against real PostgreSQL and Kafka: dead events re-driven from the
dead-letter topic, by a consumer (sync + confluent-kafka) that ran them dead before. The command
runs with each Kafka client (``--kafka-client``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine

from outboxkit.cli import main
from outboxkit.devstack.aio import run_coroutine
from outboxkit.inbox import InboxSettings, RetryPolicy
from outboxkit.inbox.readback import cancel_event
from outboxkit.kafka import KafkaClients
from outboxkit.settings import KafkaSettings
from tests.integration.inbox_support import (
    EFFECT_DDL,
    REGISTRY,
    Behaviour,
    Harness,
    effects,
    headers_for,
    inbox_state,
    payload,
    produce,
    produce_batch,
    produce_event,
)
from tests.relay_support import KAFKA_CLIENTS
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
SECRET = b"hunter2-in-a-header"


@pytest.fixture
def consumer(
    outboxkit_db_url: str, sa_url: str, outboxkit_kafka_bootstrap: str
) -> Iterator[Callable[..., Harness]]:
    """Starts consumer "billing" (sync + confluent-kafka) of a topic; stopped at the end."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    running: list[Harness] = []

    def start(topic: str, dlq: str, behaviour: Behaviour, group_id: str | None = None) -> Harness:
        harness = Harness(
            "confluent",
            sa_url=sa_url,
            bootstrap=outboxkit_kafka_bootstrap,
            topics=[topic],
            settings=InboxSettings(
                consumer="billing",
                registry=REGISTRY,
                policy=RetryPolicy(max_attempts=2, initial_delay=0.05),
            ),
            behaviour=behaviour,
            dead_letter=dlq,
            group_id=group_id,
        )
        running.append(harness.start())
        return harness

    yield start
    for harness in running:
        harness.stop()  # again: nothing


@pytest.fixture(params=KAFKA_CLIENTS)
def client(request: pytest.FixtureRequest) -> str:
    """The Kafka client the command reads and publishes with."""
    return str(request.param)


def _dlq_of(bootstrap: str, topic: str, partitions: int = 1) -> str:
    """``{topic}.dlq``, created: the name the consumers' default template gives."""
    name = f"{topic}.dlq"

    async def make() -> None:
        admin = KafkaClients(KafkaSettings.plaintext(bootstrap), timeout=60.0).admin()
        try:
            await admin.create_topic(name, partitions, {}, replication_factor=1)
        finally:
            await admin.close()

    run_coroutine(make())
    return name


def _replay(client: str, url: str, bootstrap: str, dlq: str, *args: str) -> tuple[int, str]:
    argv = ["inbox", "replay", "--consumer", "billing", "--dead-letter-topic", dlq]
    argv += ["--bootstrap", bootstrap, "--kafka-client", client, *args]
    result = CliRunner().invoke(main, argv, env={"OUTBOXKIT_DATABASE_URL": url})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


def _events(out: str) -> dict[str | None, str]:
    return {e["event_id"]: e["action"] for e in json.loads(out)["events"]}


def _dead_letter(
    event_id: str, source: str, *, consumer: str = "billing"
) -> tuple[bytes, bytes, list[Any]]:
    """The dead letter the consumer would write for an event (key b"k", order "o", amount 1)."""
    headers: list[Any] = [
        *headers_for(event_id),
        ("dlq-event-id", event_id.encode()),
        ("dlq-error", b"RuntimeError: " + SECRET),
        ("dlq-attempts", b"2"),
        ("dlq-consumer", consumer.encode()),
        ("dlq-source", source.encode()),
    ]
    return (b"k", payload("o", 1), headers)


def test_a_dead_event_replayed_runs_once_and_a_second_replay_skips_it(
    client: str,
    consumer: Callable[..., Harness],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    dlq = _dlq_of(outboxkit_kafka_bootstrap, topic, partitions=2)  # its source: topic
    doomed = str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, doomed, "o-doomed", 7, key=b"order-7")
    behaviour = Behaviour(fail_attempts=10**6)
    harness = consumer(topic, dlq, behaviour)
    wait_for(lambda: inbox_state(outboxkit_db_url, doomed) == "dead", what="dead")
    harness.wait_outcomes(doomed)
    assert effects(outboxkit_db_url, doomed) == []

    behaviour.fail_attempts = 0  # the handler is fixed
    code, out = _replay(client, outboxkit_db_url, outboxkit_kafka_bootstrap, dlq)
    assert code == 0, out
    assert f"{doomed}  replayed  (dead letter {dlq}/" in out
    assert f"to {topic}" in out
    wait_for(lambda: inbox_state(outboxkit_db_url, doomed) == "succeeded", what="succeeded")
    assert effects(outboxkit_db_url, doomed) == [(doomed, "o-doomed", 7)]

    # The record replayed is the original: its key, value and headers, no dlq-* header.
    original, replayed = read_topic(outboxkit_kafka_bootstrap, topic, expect=2)
    assert (replayed.key(), replayed.value()) == (original.key(), original.value())
    assert replayed.headers() == original.headers()
    assert not any(name.startswith("dlq-") for name, _ in replayed.headers())

    code, out = _replay(client, outboxkit_db_url, outboxkit_kafka_bootstrap, dlq, "--json")
    assert code == 0, out
    assert _events(out) == {doomed: "skipped-succeeded"}
    assert json.loads(out)["summary"] == {
        "skipped-succeeded": 1,
        "repeated_dead_letters": 0,
        "not_remembered": 0,
    }
    harness.stop()
    assert len(read_topic(outboxkit_kafka_bootstrap, topic, expect=2)) == 2  # nothing new
    assert effects(outboxkit_db_url, doomed) == [(doomed, "o-doomed", 7)]
    assert SECRET.decode() not in out


def test_cancelled_skipped_dry_run_changes_nothing_event_id_filters(
    client: str,
    consumer: Callable[..., Harness],
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic, dlq = outboxkit_topic(), outboxkit_topic(prefix="dlq")
    first, second, cancelled = (str(uuid.uuid4()) for _ in range(3))
    produce_event(outboxkit_kafka_bootstrap, topic, first, "o-1", 1)
    produce_event(outboxkit_kafka_bootstrap, topic, second, "o-2", 2)
    harness = consumer(topic, dlq, Behaviour(fail_attempts=10**6))
    for event_id in (first, second):
        wait_for(lambda e=event_id: inbox_state(outboxkit_db_url, e) == "dead", what="dead")
    harness.wait_outcomes(first, second)
    harness.stop()
    # A cancel that crossed a dead letter: the row says cancelled, the dead letter is there.
    engine = create_engine(sa_url)
    try:
        assert cancel_event(engine, "billing", cancelled, before_delivery=True).cancelled
    finally:
        engine.dispose()
    produce(outboxkit_kafka_bootstrap, dlq, [_dead_letter(cancelled, f"{topic}/0/99")])
    # and a dead letter of the same event again, and one of another consumer
    produce(outboxkit_kafka_bootstrap, dlq, [_dead_letter(first, f"{topic}/0/0")])
    produce(
        outboxkit_kafka_bootstrap,
        dlq,
        [_dead_letter(str(uuid.uuid4()), f"{topic}/0/5", consumer="shipping")],
    )

    to = ("--to-topic", topic)  # the dead-letter topic's name says nothing of it
    code, out = _replay(
        client, outboxkit_db_url, outboxkit_kafka_bootstrap, dlq, *to, "--dry-run", "--json"
    )
    assert code == 0, out
    assert _events(out) == {
        first: "would-replay",
        second: "would-replay",
        cancelled: "skipped-cancelled",
    }
    summary = json.loads(out)["summary"]
    assert summary["repeated_dead_letters"] == 1
    assert (inbox_state(outboxkit_db_url, first), inbox_state(outboxkit_db_url, second)) == (
        "dead",
        "dead",
    )
    assert len(read_topic(outboxkit_kafka_bootstrap, topic, expect=2)) == 2  # nothing published

    code, out = _replay(
        client, outboxkit_db_url, outboxkit_kafka_bootstrap, dlq, *to, "--event-id", first, "--json"
    )
    assert code == 0, out
    assert _events(out) == {first: "replayed"}
    assert inbox_state(outboxkit_db_url, first) is None  # deleted; no consumer runs to take it
    assert inbox_state(outboxkit_db_url, second) == "dead"
    assert inbox_state(outboxkit_db_url, cancelled) == "cancelled"
    records = read_topic(outboxkit_kafka_bootstrap, topic, expect=3)
    ids = [dict(r.headers())["event-id"].decode() for r in records]
    assert ids == [first, second, first]

    # The replayed record is picked up by the consumer, back with a fixed handler (its group
    # committed the offsets past the two original records).
    fixed = consumer(topic, dlq, Behaviour(), group_id=harness.group_id)
    wait_for(lambda: inbox_state(outboxkit_db_url, first) == "succeeded", what="succeeded")
    fixed.wait_outcomes(first)
    assert effects(outboxkit_db_url, first) == [(first, "o-1", 1)]
    assert inbox_state(outboxkit_db_url, second) == "dead"


def test_dead_letters_with_broken_headers_are_skipped_and_the_others_replay(
    client: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic, dlq = outboxkit_topic(), outboxkit_topic(prefix="dlq")
    good, bad_source, bad_id = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    no_source = str(uuid.uuid4())
    key, value, headers = _dead_letter(bad_source, f"{topic}/0/1")
    broken = [
        (key, value, [h for h in headers if h[0] != "dlq-source"] + [("dlq-source", SECRET)]),
        (key, value, [h for h in headers if h[0] != "dlq-consumer"]),  # whose? unknown
        (
            key,
            value,
            [*headers_for(bad_id), ("dlq-consumer", b"billing"), ("dlq-event-id", b"\xff")],
        ),
        (key, value, [h for h in _dead_letter(no_source, "x")[2] if h[0] != "dlq-source"]),
    ]
    produce(outboxkit_kafka_bootstrap, dlq, broken)
    # a header name that is not UTF-8: no client decodes the record's headers
    name_broken = _dead_letter(str(uuid.uuid4()), f"{topic}/0/3")
    produce_batch(
        outboxkit_kafka_bootstrap,
        dlq,
        [(name_broken[0], name_broken[1], [*name_broken[2], (b"\xffname", SECRET)])],
    )
    # the good one: no inbox row (purged, say), so it is published when told
    produce(outboxkit_kafka_bootstrap, dlq, [_dead_letter(good, f"{topic}/0/2")])

    args = ("--to-topic", topic, "--publish-missing")
    code, out = _replay(client, outboxkit_db_url, outboxkit_kafka_bootstrap, dlq, *args)
    assert code == 0, out
    lines = out.splitlines()  # in the order read
    assert f"{bad_source}  skipped-unusable  (dead letter {dlq}/0/0):" in lines[0]
    assert lines[0].endswith("dlq-source header is not topic/partition/offset")
    assert lines[1] == f"-  skipped-unusable  (dead letter {dlq}/0/1): no dlq-consumer header"
    assert lines[2] == (
        f"-  skipped-unusable  (dead letter {dlq}/0/2): dlq-event-id header not valid UTF-8"
    )
    assert (
        lines[3] == f"{no_source}  skipped-unusable  (dead letter {dlq}/0/3): no dlq-source header"
    )
    assert lines[4] == (
        f"-  skipped-unusable  (dead letter {dlq}/0/4):"
        " headers unreadable (a header name is not UTF-8)"
    )
    assert lines[5] == f"{good}  replayed  (dead letter {dlq}/0/5): to {topic}"
    assert "6 dead events" in lines[6]
    assert "1 replayed, 5 skipped-unusable" in lines[6]
    assert SECRET.decode() not in out
    assert "RuntimeError" not in out
    (record,) = read_topic(outboxkit_kafka_bootstrap, topic, expect=1)
    assert dict(record.headers())["event-id"] == good.encode()
    assert (record.key(), record.value()) == (b"k", payload("o", 1))


def test_a_missing_dead_letter_topic_is_one_line(
    client: str, outboxkit_db_url: str, outboxkit_kafka_bootstrap: str
) -> None:
    missing = f"no-such-{uuid.uuid4().hex[:8]}"
    code, out = _replay(client, outboxkit_db_url, outboxkit_kafka_bootstrap, missing, "--dry-run")
    assert code == 1
    assert out.strip() == f"Error: reading '{missing}': topic '{missing}' does not exist"


def test_a_dead_letter_naming_a_topic_not_allowed_is_never_published(
    client: str,
    outboxkit_db_url: str,
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Whoever writes to the dead-letter topic names the target in dlq-source: without
    --to-topic only T is published to for T.dlq, and a dead row is not even deleted."""
    topic, other = outboxkit_topic(), outboxkit_topic(prefix="other")
    dlq = _dlq_of(outboxkit_kafka_bootstrap, topic)
    forged, good = str(uuid.uuid4()), str(uuid.uuid4())
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(
            "INSERT INTO outboxkit.inbox_message (consumer, event_id, state, attempts, finished_at)"
            " VALUES ('billing', %s, 'dead', 2, now())",
            (forged,),
        )
    produce(
        outboxkit_kafka_bootstrap,
        dlq,
        [_dead_letter(forged, f"{other}/0/0"), _dead_letter(good, f"{topic}/0/1")],
    )
    code, out = _replay(
        client, outboxkit_db_url, outboxkit_kafka_bootstrap, dlq, "--json", "--publish-missing"
    )
    assert code == 0, out
    assert _events(out) == {forged: "skipped-topic-not-allowed", good: "replayed"}
    assert inbox_state(outboxkit_db_url, forged) == "dead"  # untouched
    assert read_topic(outboxkit_kafka_bootstrap, other, expect=0) == []
    (record,) = read_topic(outboxkit_kafka_bootstrap, topic, expect=1)
    assert dict(record.headers())["event-id"] == good.encode()


def test_a_publish_that_fails_after_the_delete_says_so_and_a_second_run_publishes(
    client: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """The row is gone once the publish fails: the output says to run again, exit 1; the next
    run skips the event (no row) unless told to publish such events, then publishes it."""
    dlq = outboxkit_topic(prefix="dlq")
    target = f"later-{uuid.uuid4().hex[:8]}"  # allowed, but not created yet
    doomed = str(uuid.uuid4())
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(
            "INSERT INTO outboxkit.inbox_message (consumer, event_id, state, attempts, finished_at)"
            " VALUES ('billing', %s, 'dead', 2, now())",
            (doomed,),
        )
    produce(outboxkit_kafka_bootstrap, dlq, [_dead_letter(doomed, f"{target}/0/0")])
    args = ("--to-topic", target, "--timeout", "5")
    code, out = _replay(client, outboxkit_db_url, outboxkit_kafka_bootstrap, dlq, *args)
    assert code == 1, out
    line = out.splitlines()[0]
    assert line.startswith(f"{doomed}  failed  (dead letter {dlq}/0/0): ")
    assert (
        "its dead row is deleted: run the replay again with --publish-missing --event-id"
        f" {doomed} to publish it"
    ) in line
    assert inbox_state(outboxkit_db_url, doomed) is None

    created = outboxkit_topic(prefix="later")  # a name of the factory's: allow that one
    produce(outboxkit_kafka_bootstrap, dlq, [_dead_letter(doomed, f"{created}/0/0")])
    args = ("--to-topic", created, "--timeout", "5")
    code, out = _replay(client, outboxkit_db_url, outboxkit_kafka_bootstrap, dlq, *args)
    assert code == 0, out
    assert f"{doomed}  skipped-no-row" in out  # maybe purged after it ran: not by default
    args = (*args, "--publish-missing", "--event-id", doomed)
    code, out = _replay(client, outboxkit_db_url, outboxkit_kafka_bootstrap, dlq, *args)
    assert code == 0, out
    assert f"{doomed}  skipped-topic-not-allowed" in out  # the first dead letter's target
    assert f"{doomed}  replayed" in out  # the second's
    assert len(read_topic(outboxkit_kafka_bootstrap, created, expect=1)) == 1
