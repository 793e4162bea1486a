"""After the run: what writers learned, what Kafka holds (``read_committed``), what the database
holds. Everything the checker judges is read here, after every process of the run stopped."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, TopicPartition

from outboxkit.errors import OutboxkitError
from outboxkit.kafka.config import confluent_config
from outboxkit.kafka.confluent_consumer import message_headers
from outboxkit.settings import KafkaSettings
from outboxkit.verify.history import (
    ConsumerEffect,
    InboxState,
    KafkaRecord,
    TopicSpec,
    WriteOp,
    WriteOutcome,
)
from outboxkit.verify.workload import EFFECT_TABLE
from outboxkit.wire import HEADER_EVENT_ID


class CollectError(OutboxkitError):
    """The run's results could not be read back."""


def read_writes(paths: Iterable[Path]) -> list[WriteOp]:
    """The writers' JSON-lines files; a half-written last line (a killed writer) is skipped."""
    ops: list[WriteOp] = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                data = json.loads(line)
                data["outcome"] = WriteOutcome(data["outcome"])
                ops.append(WriteOp(**data))
            except (ValueError, TypeError):
                continue
    ops.sort(key=lambda op: op.time)
    return ops


def read_topics(
    kafka: KafkaSettings, topics: Iterable[TopicSpec], timeout: float = 120.0
) -> list[KafkaRecord]:
    """Every record of the topics as a ``read_committed`` consumer sees them, to the end."""
    reader: dict[str, Any] = {
        "group.id": "outboxkit-verify-reader",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    }
    consumer = Consumer(confluent_config(kafka, None, **reader))
    parts = [TopicPartition(t.name, p, 0) for t in topics for p in range(t.partitions)]
    records: list[KafkaRecord] = []
    try:
        consumer.assign(parts)
        pending = {(tp.topic, tp.partition) for tp in parts}
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise CollectError(f"reading the topics back timed out; not at the end: {pending}")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
                    continue
                if error.retriable():
                    continue
                raise CollectError(f"reading the topics back failed: {error}")
            records.append(_record(msg))
    finally:
        consumer.close()
    return records


def _record(msg: Any) -> KafkaRecord:
    raw, _unreadable = message_headers(msg)  # a name that is not UTF-8: read as no headers
    headers = {name: value for name, value in raw if value is not None}
    raw_id = headers.get(HEADER_EVENT_ID)
    key = msg.key()
    seq: int | None = None
    try:
        seq = int(json.loads(msg.value())["seq"])
    except (ValueError, TypeError, KeyError):
        seq = None
    return KafkaRecord(
        topic=msg.topic(),
        partition=msg.partition(),
        offset=msg.offset(),
        key=key.decode(errors="replace") if key is not None else None,
        event_id=raw_id.decode(errors="replace") if raw_id is not None else None,
        seq=seq,
    )


def read_database(
    database_url: str, schema: str, consumers: list[str]
) -> tuple[list[ConsumerEffect], list[InboxState]]:
    """Effect counts and inbox states of the run's consumers."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        effects = [
            ConsumerEffect(consumer=str(c), event_id=str(e), count=int(n))
            for c, e, n in conn.execute(
                f"SELECT consumer, event_id, count(*) FROM {EFFECT_TABLE}"
                " WHERE consumer = ANY(%s) GROUP BY consumer, event_id ORDER BY 1, 2",
                (consumers,),
            ).fetchall()
        ]
        inbox = [
            InboxState(consumer=str(c), event_id=str(e), state=str(s), rows=int(n))
            for c, e, s, n in conn.execute(
                f"SELECT consumer, event_id, state, count(*) FROM {schema}.inbox_message"
                " WHERE consumer = ANY(%s) GROUP BY consumer, event_id, state ORDER BY 1, 2, 3",
                (consumers,),
            ).fetchall()
        ]
    return effects, inbox


def progress(database_url: str, schema: str, topics: list[str], consumers: list[str]) -> Progress:
    """Rows still pending, rows published, and events each consumer settled (for draining)."""
    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        states: dict[str, int] = dict(
            conn.execute(
                f"SELECT state, count(*) FROM {schema}.outbox_message WHERE topic = ANY(%s)"
                " GROUP BY state",
                (topics,),
            ).fetchall()
        )
        settled: dict[str, int] = dict(
            conn.execute(
                f"SELECT consumer, count(*) FROM {schema}.inbox_message WHERE consumer = ANY(%s)"
                " AND state <> 'processing' GROUP BY consumer",
                (consumers,),
            ).fetchall()
        )
    return Progress(
        pending=int(states.get("pending", 0)),
        published=int(states.get("published", 0)),
        settled={c: int(settled.get(c, 0)) for c in consumers},
    )


class Progress:
    def __init__(self, pending: int, published: int, settled: dict[str, int]) -> None:
        self.pending = pending
        self.published = published
        self.settled = settled

    @property
    def drained(self) -> bool:
        return self.pending == 0 and all(n >= self.published for n in self.settled.values())
