"""After the run: what writers learned, what Kafka holds (``read_committed``), what the database
holds. Everything the checker judges is read here, after every process of the run stopped."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from outboxkit import db
from outboxkit.errors import OutboxkitError, PublishError
from outboxkit.kafka.api import ConsumedRecord
from outboxkit.schema import OutboxState
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
    """Every record of the topics as a ``read_committed`` consumer sees them, to the end
    (through the Kafka seam: a refused configuration is a ``ConfigurationError``)."""
    from outboxkit.kafka.confluent_readback import read_to_end  # confluent-kafka: imported late

    parts = [(t.name, p) for t in topics for p in range(t.partitions)]
    try:
        return [_record(record) for record in read_to_end(kafka, parts, timeout)]
    except PublishError as exc:
        raise CollectError(str(exc)) from exc


def _record(record: ConsumedRecord) -> KafkaRecord:
    # a header name that is not UTF-8: read as no headers
    headers = {name: value for name, value in record.headers if value is not None}
    raw_id = headers.get(HEADER_EVENT_ID)
    key = record.key
    seq: int | None = None
    try:
        seq = int(json.loads(record.value or b"")["seq"])
    except (ValueError, TypeError, KeyError):
        seq = None
    return KafkaRecord(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=key.decode(errors="replace") if key is not None else None,
        event_id=raw_id.decode(errors="replace") if raw_id is not None else None,
        seq=seq,
    )


def read_database(
    database_url: str, schema: str, consumers: list[str]
) -> tuple[list[ConsumerEffect], list[InboxState]]:
    """Effect counts and inbox states of the run's consumers."""
    with db.connect(database_url, connect_timeout=10) as conn:
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


# Outbox states a row does not leave by itself: a published row is expected at every consumer;
# a parked one goes to Kafka only after an operator's retry (none in a run), a discarded one never.
FINAL_STATES = frozenset({OutboxState.PUBLISHED, OutboxState.PARKED, OutboxState.DISCARDED})


def progress(database_url: str, schema: str, topics: list[str], consumers: list[str]) -> Progress:
    """The run's outbox rows by state, and events each consumer settled (for draining)."""
    with db.connect(database_url, connect_timeout=5) as conn:
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
    return Progress.of(states, settled, consumers)


@dataclass(frozen=True)
class Progress:
    """What the drain waits for. Every state but the final ones waits: 'pending', and the rows
    the relay moved out of its claims' way ('scheduled' for later, 'held' behind a parked row
    of their key), which go out once due or once that row is retried, discarded or deleted; so
    would a state a later migration adds (the drain then waits out its timeout rather than
    ending before rows went out)."""

    waiting: int  # rows in no final state
    published: int
    settled: dict[str, int]  # consumer -> events it settled

    @classmethod
    def of(
        cls, states: Mapping[str, int], settled: Mapping[str, int], consumers: Iterable[str]
    ) -> Progress:
        return cls(
            waiting=sum(int(n) for s, n in states.items() if s not in FINAL_STATES),
            published=int(states.get(OutboxState.PUBLISHED, 0)),
            settled={c: int(settled.get(c, 0)) for c in consumers},
        )

    @property
    def drained(self) -> bool:
        return self.waiting == 0 and all(n >= self.published for n in self.settled.values())
