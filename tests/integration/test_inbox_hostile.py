"""Hostile input on the real stack, over both drivers (sync + confluent-kafka, async + aiokafka).

Every record ends in a readable terminal state (an inbox row or an ``inbox_rejection``) with its
reason, within bounded time, and the valid records produced after it are processed: nothing
holds a partition. Error text stored or published carries no bound SQL parameters.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine

from outboxkit.errors import ConfigurationError
from outboxkit.inbox import AsyncInbox, Inbox, InboxSettings, OutcomeKind, RetryPolicy
from outboxkit.settings import KafkaSettings
from tests.integration.inbox_support import (
    REGISTRY,
    Behaviour,
    effects,
    fetch,
    headers_for,
    inbox_row,
    inbox_state,
    payload,
    produce,
    produce_batch,
    produce_event,
)
from tests.integration.test_inbox_conformance import adapter, start  # noqa: F401
from tests.support.topics import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
Start = Callable[..., Any]
SECRET = "ssn-078-05-1120"
BOUND = 120.0  # seconds within which every record must have ended
WARM_UP = 40  # records before a hostile one, enough for CPython to specialise the code


def _rejections(db_url: str, topic: str) -> dict[int, tuple[Any, ...]]:
    rows = fetch(
        db_url,
        "SELECT kafka_offset, event_id, reason, event_type FROM outboxkit.inbox_rejection"
        " WHERE topic = %s",
        (topic,),
    )
    return {int(r[0]): r[1:] for r in rows}


def _with(headers: list[tuple[str, bytes]], name: str, value: bytes) -> list[tuple[str, bytes]]:
    return [(n, v) for n, v in headers if n != name] + [(name, value)]


def test_every_hostile_record_ends_readable_and_later_records_run(
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    dlq = outboxkit_topic(prefix="dlq")
    first, valid = str(uuid.uuid4()), str(uuid.uuid4())
    big, unknown = str(uuid.uuid4()), str(uuid.uuid4())
    ids = [str(uuid.uuid4()) for _ in range(5)]
    good = payload("o", 1)
    hostile: list[tuple[str, bytes | None, bytes, list[tuple[str, bytes]]]] = [
        ("nul event id", b"k", good, _with(headers_for("x"), "event-id", b"ev\x00il")),
        ("3 KB event id", b"k", good, _with(headers_for("x"), "event-id", b"e" * 3000)),
        ("bad utf-8 id", b"k", good, _with(headers_for("x"), "event-id", b"\xff\xfe\xfd")),
        ("nul event type", b"k", good, headers_for(ids[0], event_type="pay\x00ment")),
        ("nul idem key", b"k", good, headers_for(ids[1], key="i\x00k")),
        ("escape sequence", b"k", good, headers_for(ids[2], event_type="\x1b]0;pwned\x07")),
        ("garbage payload", b"k", bytes(range(256)), headers_for(ids[3])),
        ("deep json", b"k", b"[" * 100_000 + b"]" * 100_000, headers_for(ids[4])),
        ("unknown type", b"k", good, headers_for(unknown, event_type="no.such")),
        ("first", b"k", payload("o-first", 1), headers_for(first)),
        ("same id other content", b"k", payload("o-other", 2), headers_for(first)),
        ("~1 MB record", b"k", payload("b" * 980_000, 3), headers_for(big)),
        ("valid", b"k", payload("o-valid", 4), headers_for(valid)),
    ]
    produce(outboxkit_kafka_bootstrap, topic, [(k, v, h) for _, k, v, h in hostile])
    harness = start([topic], Behaviour(), dead_letter=dlq)
    wait_for(
        lambda: inbox_state(outboxkit_db_url, valid) == "succeeded", timeout=BOUND, what="valid"
    )
    assert inbox_state(outboxkit_db_url, first) == "succeeded"
    assert inbox_state(outboxkit_db_url, big) == "succeeded"
    rejected = _rejections(outboxkit_db_url, topic)
    # Header problems: recorded before any SQL touched an inbox row, under a safe id.
    for offset in (0, 1, 2):
        event_id, reason, _event_type = rejected[offset]
        assert event_id.startswith("sha256:"), hostile[offset][0]
        assert "header 'event-id' refused" in reason
    assert "contains control characters" in rejected[0][1]
    assert "3000 bytes" in rejected[1][1]
    assert "not valid UTF-8" in rejected[2][1]
    assert rejected[3][0] == ids[0]
    assert "'event-type' refused" in rejected[3][1]
    assert rejected[3][2] is None
    assert "'idempotency-key' refused" in rejected[4][1]
    assert "\\x1b" in rejected[5][1]
    # Decode problems: the claimed row ends rejected with a bounded reason.
    for event_id, why in (
        (ids[3], "payload is not a valid"),
        (ids[4], "payload is not a valid"),
        (unknown, "unknown event type 'no.such'"),
    ):
        row = inbox_row(outboxkit_db_url, "billing", event_id)
        assert row is not None, why
        assert row["state"] == "rejected"
        assert why in row["last_error"]
        assert len(row["last_error"]) <= 1100
    assert "reused with different content" in rejected[10][1]
    for _, reason, _ in rejected.values():
        assert reason.isprintable()
        assert len(reason) <= 1100
    assert harness.error is None


def test_a_header_name_that_is_not_utf8_is_rejected_and_nothing_else_is_lost(
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Both client libraries fail to decode such a name (aiokafka the whole fetch, confluent-kafka
    the message's headers); the record is rejected with the reason, the records around it (in
    the same record batch, and of the other partition) are processed, in order."""
    topic = outboxkit_topic(partitions=2)
    before, after, later, other1, other2 = (str(uuid.uuid4()) for _ in range(5))
    produce(
        outboxkit_kafka_bootstrap,
        topic,
        [
            (b"k", payload("o-1", 1), headers_for(other1)),
            (b"k", payload("o-2", 2), headers_for(other2)),
        ],
        partition=1,
    )
    # Warm-up records first: CPython specialises a hot call site, and a specialised call of
    # confluent-kafka's headers() no longer raises but returns with the error still pending.
    warm = [str(uuid.uuid4()) for _ in range(WARM_UP)]
    produce(
        outboxkit_kafka_bootstrap,
        topic,
        [(b"k", payload("warm", 0), headers_for(event_id)) for event_id in warm],
    )
    hostile: list[tuple[str | bytes, bytes]] = [(b"\xff\xfe", b"v"), *headers_for("never-read")]
    batch: list[tuple[bytes | None, bytes, list[tuple[str | bytes, bytes]]]] = [
        (b"k", payload("before", 1), list(headers_for(before))),
        (b"k", payload("hostile", 2), hostile),
        (b"k", payload("after", 3), list(headers_for(after))),
    ]
    produce_batch(outboxkit_kafka_bootstrap, topic, batch, partition=0)
    produce(outboxkit_kafka_bootstrap, topic, [(b"k", payload("later", 4), headers_for(later))])
    harness = start([topic], Behaviour())
    valid = (*warm, before, after, later, other1, other2)

    def settled() -> bool:  # or the consumer died
        done = all(inbox_state(outboxkit_db_url, e) == "succeeded" for e in valid)
        return harness.error is not None or done

    wait_for(settled, timeout=BOUND, what="the valid records")
    assert harness.error is None, repr(harness.error)
    rows = fetch(
        outboxkit_db_url,
        "SELECT kafka_partition, kafka_offset, event_id, reason FROM outboxkit.inbox_rejection"
        " WHERE topic = %s",
        (topic,),
    )
    assert rows == [
        (0, WARM_UP + 1, None, "headers refused: a header name is not valid UTF-8: b'\\xff\\xfe'")
    ]
    assert inbox_row(outboxkit_db_url, "billing", "never-read") is None
    order = [row[0] for row in effects(outboxkit_db_url) if row[0] in (before, after, later)]
    assert order == [before, after, later]
    assert harness.error is None


def _sync(event: Any, ctx: Any, session: Any) -> None:
    return None


async def _async(event: Any, ctx: Any, session: Any) -> None:
    return None


def test_a_missing_dead_letter_topic_fails_fast_naming_it(
    adapter: str,  # noqa: F811
    sa_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    options: dict[str, Any] = {"group_id": f"g-{uuid.uuid4().hex[:8]}", "topics": [topic]}
    settings = InboxSettings(consumer="billing", registry=REGISTRY)
    kafka = KafkaSettings(bootstrap=outboxkit_kafka_bootstrap)
    missing = f"'{topic}.dlq' does not exist"
    if adapter == "confluent":
        from outboxkit.inbox.confluent import ConfluentInboxConsumer

        engine = create_engine(sa_url)
        consumer = ConfluentInboxConsumer(Inbox(engine, _sync, settings), kafka, **options)
        with pytest.raises(ConfigurationError, match=missing):
            consumer.start()
        engine.dispose()
        return

    async def main() -> None:
        from outboxkit.inbox.aiokafka import AiokafkaInboxConsumer

        engine = create_async_engine(sa_url)
        inbox = AsyncInbox(engine, _async, settings)
        consumer = AiokafkaInboxConsumer(inbox, kafka, **options)
        with pytest.raises(ConfigurationError, match=missing):
            await consumer.start()
        await engine.dispose()

    asyncio.run(main())


@pytest.mark.parametrize("problem", ["missing", "too small"])
def test_a_dead_letter_that_cannot_be_published_ends_dead_with_the_reason(
    problem: str,
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic = outboxkit_topic()
    if problem == "missing":
        dlq = f"missing-{uuid.uuid4().hex[:8]}"
    else:
        dlq = outboxkit_topic(prefix="dlq", config={"max.message.bytes": "1000"})
    doomed, later = str(uuid.uuid4()), str(uuid.uuid4())
    produce(
        outboxkit_kafka_bootstrap,
        topic,
        [
            (b"k", payload("d" * 4000, 1), headers_for(doomed)),
            (b"k", payload("o-later", 2), headers_for(later)),
        ],
    )
    behaviour = Behaviour(fail_attempts=10**6, fail_only=doomed)
    harness = start(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=1),
        dead_letter=dlq,
        consumer_options={"dead_letter_check": "warn"},
        # A missing topic fails only when the producer gives up waiting for it.
        sender_timeout=5.0 if problem == "missing" else None,
    )
    wait_for(
        lambda: inbox_state(outboxkit_db_url, later) == "succeeded", timeout=BOUND, what="later"
    )
    row = inbox_row(outboxkit_db_url, "billing", doomed)
    assert row is not None
    assert row["state"] == "dead"
    assert f"dead letter could not be published to '{dlq}'" in row["last_error"]
    assert "boom on attempt 1" in row["last_error"]
    harness.wait_outcomes(doomed, later)
    labels = {"consumer": "billing", "alert": "dead_letter_failed"}
    assert harness.metrics.registry.get_sample_value("outboxkit_inbox_alerts_total", labels) == 1


def test_error_text_carries_no_parameter_values(
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS public.secret_once (v text PRIMARY KEY)")
        conn.execute("INSERT INTO public.secret_once VALUES (%s) ON CONFLICT DO NOTHING", (SECRET,))
    topic, dlq, acks = (outboxkit_topic(prefix=p) for p in ("t", "dlq", "acks"))
    data_error, integrity_error = str(uuid.uuid4()), str(uuid.uuid4())
    produce(outboxkit_kafka_bootstrap, topic, [(b"k", payload("o", 1), headers_for(data_error))])
    produce(
        outboxkit_kafka_bootstrap, topic, [(b"k", payload("o", 2), headers_for(integrity_error))]
    )
    statements = {
        data_error: "SELECT CAST(:secret AS integer)",
        integrity_error: "INSERT INTO public.secret_once VALUES (:secret)",
    }

    behaviour = Behaviour(
        sql={k: text(v) for k, v in statements.items()}, sql_params={"secret": SECRET}
    )
    start(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=1),
        dead_letter=dlq,
        acks_topic=acks,
    )
    for event_id in statements:
        wait_for(lambda e=event_id: inbox_state(outboxkit_db_url, e) == "dead", what=event_id)
        error = str((inbox_row(outboxkit_db_url, "billing", event_id) or {})["last_error"])
        assert SECRET not in error
        assert "SQLSTATE" in error
    letters = read_topic(outboxkit_kafka_bootstrap, dlq, expect=2)
    for record in letters:
        headers = dict(record.headers())
        assert SECRET.encode() not in headers["dlq-error"]
        assert b"SQLSTATE" in headers["dlq-error"]
    for record in read_topic(outboxkit_kafka_bootstrap, acks, expect=2):
        body = json.loads(record.value())
        assert body["state"] == "dead"
        assert SECRET not in str(body["error"])


def _order_id(env: Any) -> Any:
    """An application's event_id_from that trusts the payload, as many would."""
    return json.loads(env.value or b"")["order_id"]


def test_an_event_id_from_that_fails_on_a_record_rejects_it_and_later_records_run(
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    """Records without an event-id header go through the application's callable; one it
    cannot read (it raises, or returns something other than text) is rejected with the
    reason, instead of being retried on the same offset for ever."""
    topic = outboxkit_topic()
    later = str(uuid.uuid4())
    produce(
        outboxkit_kafka_bootstrap,
        topic,
        [
            (b"k", b"not json", []),
            (b"k", b'{"no_order_id": 1}', []),
            (b"k", b'{"order_id": 7}', []),
            (b"k", payload("o-later", 1), headers_for(later)),
        ],
    )
    start([topic], Behaviour(), event_id_from=_order_id)
    wait_for(
        lambda: inbox_state(outboxkit_db_url, later) == "succeeded", timeout=BOUND, what="later"
    )
    rejected = _rejections(outboxkit_db_url, topic)
    assert "event_id_from raised JSONDecodeError" in rejected[0][1]
    assert "event_id_from raised KeyError: 'order_id'" in rejected[1][1]
    assert "event_id_from returned int, not str or None" in rejected[2][1]
    assert sorted(rejected) == [0, 1, 2]


def test_a_held_record_deleted_from_the_log_does_not_stall_its_partition(
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The record held for a retry leaves the log before its retry is due (here
    ``delete_records``; retention and compaction do the same). The seek back to it resumes at
    the log's new start: the records there are processed, not dropped while waiting for an
    offset that never comes back, and the gone record's event ends dead, with the reason, which
    its acknowledgement tells the producer (no delivery of it ever will)."""
    topic, acks = outboxkit_topic(), outboxkit_topic(prefix="acks")
    held, later = str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, held, "o-held", 1)
    behaviour = Behaviour(fail_attempts=1, fail_only=held)
    policy = RetryPolicy(initial_delay=5, max_delay=5)
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        harness = start([topic], behaviour, policy=policy, acks_topic=acks)
        wait_for(
            lambda: any(o.kind is OutcomeKind.RETRY for o in list(harness.outcomes)),
            timeout=60,
            what="the first event held for a retry",
        )
        admin = AdminClient({"bootstrap.servers": outboxkit_kafka_bootstrap})
        for done in admin.delete_records([TopicPartition(topic, 0, 1)]).values():
            assert done.result(timeout=30).low_watermark == 1
        produce_event(outboxkit_kafka_bootstrap, topic, later, "o-later", 2)
        wait_for(
            lambda: inbox_state(outboxkit_db_url, later) == "succeeded",
            timeout=30,
            what="the record after the deleted one",
        )
        wait_for(
            lambda: inbox_state(outboxkit_db_url, held) == "dead",
            timeout=30,
            what="the gone record's event ended",
        )
    assert [e[0] for e in effects(outboxkit_db_url)] == [later]  # the failed run rolled back
    row = inbox_row(outboxkit_db_url, "billing", held)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("dead", 1)
    assert row["last_error"] == (
        f"its record ({topic}/0 at offset 0) left the log (retention, compaction or"
        " delete_records) while held for a retry"
    )
    gone = f"{topic}/0: held record at offset 0 is gone; resuming at 1"
    assert gone in caplog.messages
    records = read_topic(outboxkit_kafka_bootstrap, acks, expect=2)
    bodies = {b["event_id"]: b for b in (json.loads(r.value()) for r in records)}
    assert len(records) == len(bodies) == 2
    assert bodies[later]["state"] == "succeeded"
    assert {k: bodies[held][k] for k in ("state", "attempts", "error", "offset")} == {
        "state": "dead",
        "attempts": 1,
        "error": row["last_error"],
        "offset": 0,
    }
    assert (bodies[held]["topic"], bodies[held]["consumer"]) == (topic, "billing")
