"""Re-driving dead events from a dead-letter topic (``outboxkit inbox replay``): the decisions.

Which dead letters count (one consumer's, one per event id, readable headers), what each row
state means for its event, and the order of the two changes a replay makes: the ``dead`` row
is deleted first, the record published second. Published first, the record could reach the
consumer while the row still says ``dead``: skipped as a duplicate, for good. A crash between
the two leaves no row and the dead letter where it was, and no row means "publish": the next
run finishes the replay.

Nothing here reads Kafka or the database: the command hands in the records it read and the
functions that look a row up, delete it and publish.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from outboxkit.errors import PublishError
from outboxkit.events import MAX_TOPIC_LENGTH
from outboxkit.inbox.deadletter import (
    HEADER_DLQ_CONSUMER,
    HEADER_DLQ_EVENT_ID,
    HEADER_DLQ_SOURCE,
)
from outboxkit.inbox.guard import bounded
from outboxkit.kafka.api import ConsumedRecord
from outboxkit.schema import InboxState
from outboxkit.wire import HEADER_EVENT_ID, HEADER_LIMITS, header_problem

DLQ_PREFIX = "dlq-"
_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
_NUMBER = re.compile(r"[0-9]{1,19}")


class Step(StrEnum):
    """What a row state means for a dead letter's event."""

    PUBLISH = "publish"  # no row: purged, or deleted by a replay that stopped before publishing
    FORGET_THEN_PUBLISH = "forget-then-publish"  # dead: delete the row, then publish
    SKIP_CANCELLED = "skipped-cancelled"  # an operator's cancel stands
    SKIP_SUCCEEDED = "skipped-succeeded"  # replayed already (or handled after all)
    SKIP_PROCESSING = "skipped-processing"  # running now
    SKIP_REJECTED = "skipped-rejected"  # refused for good (another content under this id)


_SKIPS = {
    InboxState.CANCELLED: Step.SKIP_CANCELLED,
    InboxState.SUCCEEDED: Step.SKIP_SUCCEEDED,
    InboxState.PROCESSING: Step.SKIP_PROCESSING,
    InboxState.REJECTED: Step.SKIP_REJECTED,
}


def decide(state: InboxState | None) -> Step:
    """The step for an event whose row is in ``state`` (``None``: no row)."""
    if state is None:
        return Step.PUBLISH
    if state is InboxState.DEAD:
        return Step.FORGET_THEN_PUBLISH
    return _SKIPS[state]


REPLAYED = "replayed"
WOULD_REPLAY = "would-replay"
FAILED = "failed"
UNUSABLE = "skipped-unusable"
CHANGING = "skipped-changing"


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter to replay: the original record as the consumer got it."""

    event_id: str
    where: str  # the dead letter's own topic/partition/offset
    source_topic: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...]  # the original ones: no ``dlq-*`` header


@dataclass(frozen=True)
class Unusable:
    """A dead letter that cannot be replayed; ``reason`` never quotes a header value."""

    where: str
    event_id: str | None  # when its dlq-event-id header is readable
    reason: str


@dataclass(frozen=True)
class Outcome:
    """What became of one event (or of one unusable dead letter)."""

    event_id: str | None
    where: str
    action: str
    detail: str | None = None


def _where(record: ConsumedRecord) -> str:
    return f"{record.topic}/{record.partition}/{record.offset}"


def source_topic(text: str) -> str | None:
    """The topic of a ``dlq-source`` value (``topic/partition/offset``), or ``None`` when it
    is not one (a topic name Kafka would refuse, a part that is no number)."""
    topic, sep, rest = text.partition("/")
    partition, sep2, offset = rest.partition("/")
    if not (sep and sep2) or topic in (".", "..") or len(topic) > MAX_TOPIC_LENGTH:
        return None
    if not (_TOPIC.fullmatch(topic) and _NUMBER.fullmatch(partition)):
        return None
    return topic if _NUMBER.fullmatch(offset) else None


def _text(
    values: dict[str, list[bytes | None]], name: str, limit: int
) -> tuple[str | None, str | None]:
    """The header's text, or why it cannot be used (a reason naming the header only)."""
    found = values.get(name, [])
    if not found or found[0] is None:
        return None, f"no {name} header"
    if len(found) > 1:
        return None, f"{name} header given {len(found)} times"
    problem = header_problem(found[0], limit)
    if problem is not None:
        return None, f"{name} header {problem}"
    return found[0].decode(), None


def read_dead_letter(
    record: ConsumedRecord, consumer: str, event_ids: Collection[str] | None = None
) -> DeadLetter | Unusable | None:
    """The dead letter ``record`` is for ``consumer``; ``None`` when it is another consumer's
    (or, with ``event_ids``, another event's). One whose consumer or event cannot be read is
    :class:`Unusable` (it may be this consumer's: it is reported, never passed over)."""
    where = _where(record)
    if record.header_error is not None:
        return Unusable(where, None, "headers unreadable (a header name is not UTF-8)")
    values: dict[str, list[bytes | None]] = {}
    for name, value in record.headers:
        values.setdefault(name, []).append(value)
    owner, problem = _text(values, HEADER_DLQ_CONSUMER, HEADER_LIMITS[HEADER_EVENT_ID])
    if owner is None:
        return Unusable(where, None, str(problem))
    if owner != consumer:
        return None
    event_id, problem = _text(values, HEADER_DLQ_EVENT_ID, HEADER_LIMITS[HEADER_EVENT_ID])
    if event_id is None or not event_id:
        return Unusable(where, None, str(problem or f"empty {HEADER_DLQ_EVENT_ID} header"))
    if event_ids is not None and event_id not in event_ids:
        return None
    source, problem = _text(values, HEADER_DLQ_SOURCE, 2 * MAX_TOPIC_LENGTH)
    if source is None:
        return Unusable(where, event_id, str(problem))
    topic = source_topic(source)
    if topic is None:
        reason = f"{HEADER_DLQ_SOURCE} header is not topic/partition/offset"
        return Unusable(where, event_id, reason)
    if record.value is None:
        return Unusable(where, event_id, "no value (a tombstone)")
    kept = tuple((n, v) for n, v in record.headers if not n.startswith(DLQ_PREFIX))
    return DeadLetter(event_id, where, topic, record.key, record.value, kept)


@dataclass
class Selection:
    """The consumer's dead letters on the topic: one per event id, in the order first read."""

    letters: list[DeadLetter] = field(default_factory=list)
    unusable: list[Unusable] = field(default_factory=list)
    repeats: int = 0  # further dead letters of an event already selected
    others: int = 0  # records of other consumers (or events not asked for)


def select(
    records: Iterable[ConsumedRecord], consumer: str, event_ids: Collection[str] | None = None
) -> Selection:
    """Each event once: its first usable dead letter. An unusable one of an event that has a
    usable one is a repeat; an event with none is reported once."""
    chosen: dict[str, DeadLetter] = {}
    unusable: dict[str, Unusable] = {}
    nameless: list[Unusable] = []
    out = Selection()
    for record in records:
        found = read_dead_letter(record, consumer, event_ids)
        if found is None:
            out.others += 1
        elif isinstance(found, DeadLetter):
            if found.event_id in chosen:
                out.repeats += 1
            else:
                chosen[found.event_id] = found
                if unusable.pop(found.event_id, None) is not None:
                    out.repeats += 1
        elif found.event_id is None:
            nameless.append(found)
        elif found.event_id in chosen or found.event_id in unusable:
            out.repeats += 1
        else:
            unusable[found.event_id] = found
    out.letters = list(chosen.values())
    out.unusable = nameless + list(unusable.values())
    return out


def replay_one(
    letter: DeadLetter,
    *,
    state_of: Callable[[str], InboxState | None],
    forget: Callable[[str], bool],
    publish: Callable[[DeadLetter], None],
    dry_run: bool = False,
) -> Outcome:
    """Replay one event: look its row up, act on its state (:func:`decide`).

    A ``dead`` row is deleted only while still ``dead`` (``forget``); one that changed
    meanwhile is looked up again and decided anew. The record is published only after that,
    ``publish`` returning once the broker acknowledged it (a :class:`PublishError`: ``failed``;
    the row, if it was deleted, stays deleted, and the next run publishes)."""
    event_id = letter.event_id
    state = state_of(event_id)
    for _ in range(2):
        step = decide(state)
        if step not in (Step.PUBLISH, Step.FORGET_THEN_PUBLISH):
            return Outcome(event_id, letter.where, step.value)
        if dry_run:
            detail = "dead row" if step is Step.FORGET_THEN_PUBLISH else "no row"
            return Outcome(event_id, letter.where, WOULD_REPLAY, detail)
        if step is Step.FORGET_THEN_PUBLISH and not forget(event_id):
            state = state_of(event_id)
            continue
        try:
            publish(letter)
        except PublishError as exc:
            return Outcome(event_id, letter.where, FAILED, bounded(str(exc)))
        return Outcome(event_id, letter.where, REPLAYED, f"to {letter.source_topic}")
    return Outcome(event_id, letter.where, CHANGING, "its row changed while replaying")


def unusable_outcome(found: Unusable) -> Outcome:
    return Outcome(found.event_id, found.where, UNUSABLE, found.reason)


__all__ = [
    "DeadLetter",
    "Outcome",
    "Selection",
    "Step",
    "Unusable",
    "decide",
    "read_dead_letter",
    "replay_one",
    "select",
    "source_topic",
]
