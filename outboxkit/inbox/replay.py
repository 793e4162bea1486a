"""Re-driving dead events from a dead-letter topic (``outboxkit inbox replay``): the decisions.

Which dead letters count (one consumer's, one per event id, readable headers), which topics a
replay may publish to, what each row state means for its event, and the order of the two
changes a replay makes: the ``dead`` row is deleted first, the record published second.
Published first, the record could reach the consumer while the row still says ``dead``: skipped
as a duplicate, for good. A crash between the two leaves no row and the dead letter where it
was, and no row: the next run finishes the replay when told to publish events without a row
(``--publish-missing``). Not by default, because no row also means a row purged after its
event ran: a replay that published it again would apply the event twice.

The topic a record goes to is named by its ``dlq-source`` header, which anyone who can write to
the dead-letter topic can set: it is published only to a topic the operator allowed
(:func:`targets`). Dead letters are decided as they are read (:class:`Replay`), remembering only
the event ids already seen, up to a bound. Nothing here reads Kafka or the database: the command
hands in each record and the functions that look a row up, delete it and publish.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from enum import StrEnum

from outboxkit.errors import PublishError
from outboxkit.events import MAX_TOPIC_LENGTH
from outboxkit.inbox.deadletter import (
    DEFAULT_DEAD_LETTER_TOPIC,
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

    PUBLISH = "publish"  # no row, and told to publish such events (--publish-missing)
    FORGET_THEN_PUBLISH = "forget-then-publish"  # dead: delete the row, then publish
    SKIP_CANCELLED = "skipped-cancelled"  # an operator's cancel stands
    SKIP_SUCCEEDED = "skipped-succeeded"  # replayed already (or handled after all)
    SKIP_PROCESSING = "skipped-processing"  # running now
    SKIP_REJECTED = "skipped-rejected"  # refused for good (another content under this id)
    # No row: deleted by a replay that stopped before publishing, or purged (after the event
    # ran, perhaps: published again, it would run twice). Published only when told to.
    SKIP_NO_ROW = "skipped-no-row"


_SKIPS = {
    InboxState.CANCELLED: Step.SKIP_CANCELLED,
    InboxState.SUCCEEDED: Step.SKIP_SUCCEEDED,
    InboxState.PROCESSING: Step.SKIP_PROCESSING,
    InboxState.REJECTED: Step.SKIP_REJECTED,
}


def decide(state: InboxState | None, *, publish_missing: bool = False) -> Step:
    """The step for an event whose row is in ``state`` (``None``: no row, published only with
    ``publish_missing``)."""
    if state is None:
        return Step.PUBLISH if publish_missing else Step.SKIP_NO_ROW
    if state is InboxState.DEAD:
        return Step.FORGET_THEN_PUBLISH
    return _SKIPS[state]


REPLAYED = "replayed"
NOT_ALLOWED = "skipped-topic-not-allowed"
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


def replay_one(
    letter: DeadLetter,
    *,
    state_of: Callable[[str], InboxState | None],
    forget: Callable[[str], bool],
    publish: Callable[[DeadLetter], None],
    dry_run: bool = False,
    publish_missing: bool = False,
) -> Outcome:
    """Replay one event: look its row up, act on its state (:func:`decide`).

    A ``dead`` row is deleted only while still ``dead`` (``forget``); one that changed
    meanwhile is looked up again and decided anew. The record is published only after that,
    ``publish`` returning once the broker acknowledged it (a :class:`PublishError`: ``failed``,
    saying so: the row, if it was deleted, stays deleted, and a run with ``publish_missing``
    publishes it)."""
    event_id = letter.event_id
    state = state_of(event_id)
    for _ in range(2):
        step = decide(state, publish_missing=publish_missing)
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
            gone = "its dead row is deleted" if step is Step.FORGET_THEN_PUBLISH else "no row"
            why = (
                f"{exc}; {gone}: run the replay again with --publish-missing --event-id"
                f" {event_id} to publish it"
            )
            return Outcome(event_id, letter.where, FAILED, bounded(why))
        return Outcome(event_id, letter.where, REPLAYED, f"to {letter.source_topic}")
    return Outcome(event_id, letter.where, CHANGING, "its row changed while replaying")


def unusable_outcome(found: Unusable) -> Outcome:
    return Outcome(found.event_id, found.where, UNUSABLE, found.reason)


# --- where a replay may publish --------------------------------------------------------------


@dataclass(frozen=True)
class Targets:
    """The topics a replay publishes to; ``refusal`` says why another is not one, and what
    to do."""

    allowed: frozenset[str]
    refusal: str

    def problem(self, topic: str) -> str | None:
        return None if topic in self.allowed else self.refusal


def source_of(dead_letter_topic: str, template: str = DEFAULT_DEAD_LETTER_TOPIC) -> str | None:
    """The topic whose dead letters go to ``dead_letter_topic`` under ``template`` (the
    consumers' default ``{topic}.dlq``): ``payments`` for ``payments.dlq``; ``None`` when the
    name does not fit the template."""
    prefix, _, suffix = template.partition("{topic}")
    if not (dead_letter_topic.startswith(prefix) and dead_letter_topic.endswith(suffix)):
        return None
    topic = dead_letter_topic[len(prefix) : len(dead_letter_topic) - len(suffix)]
    return topic if source_topic(f"{topic}/0/0") == topic else None


def targets(dead_letter_topic: str, to_topics: Collection[str]) -> Targets:
    """``to_topics`` (``--to-topic``) when given; else the topic ``dead_letter_topic`` is the
    dead-letter topic of under the default template; else none at all."""
    if to_topics:
        return Targets(frozenset(to_topics), "dlq-source names a topic not given as --to-topic")
    source = source_of(dead_letter_topic)
    if source is None:
        why = (
            f"the dead-letter topic's name does not end in"
            f" {DEFAULT_DEAD_LETTER_TOPIC.partition('{topic}')[2]!r}, so no source topic follows"
            " from it: pass --to-topic with each topic its records may go to"
        )
        return Targets(frozenset(), why)
    why = f"dlq-source names a topic other than {source!r} (pass --to-topic to allow others)"
    return Targets(frozenset({source}), why)


# --- a run: each dead letter decided as it is read ------------------------------------------


class Seen:
    """Event ids met in this run, as 16-byte digests, at most ``limit`` of them (bounded
    memory whatever the ids' length). Past the bound an id is not remembered: a further dead
    letter of it is decided by its row alone (see :class:`Replay`)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._ids: dict[bytes, bool] = {}  # digest -> whether a usable dead letter was acted on
        self.full = 0  # dead letters whose event id was not remembered for want of room

    @staticmethod
    def _key(event_id: str) -> bytes:
        return hashlib.blake2b(event_id.encode(), digest_size=16).digest()

    def get(self, event_id: str) -> bool | None:
        return self._ids.get(self._key(event_id))

    def put(self, event_id: str, usable: bool) -> None:
        key = self._key(event_id)
        if key in self._ids or len(self._ids) < self.limit:
            self._ids[key] = usable
        else:
            self.full += 1


@dataclass
class Replay:
    """One run over the dead-letter topic: :meth:`handle` each record as it is read.

    Each event is acted on once, at its first usable dead letter naming an allowed topic; its
    further dead letters are repeats. An unusable one, or one naming a topic not allowed, is
    reported once per event (each nameless one on its own), and a good one read after it still
    replays the event (a forged dead letter cannot block the real one). Past ``Seen``'s bound,
    a further dead letter of an event not remembered is decided again by its row: a replayed
    event not yet handled (no row) is skipped, or with ``publish_missing`` published again,
    which the consumer skips as a duplicate."""

    consumer: str
    event_ids: Collection[str] | None
    allowed: Targets
    state_of: Callable[[str], InboxState | None]
    forget: Callable[[str], bool]
    publish: Callable[[DeadLetter], None]
    dry_run: bool = False
    limit: int = 100_000
    publish_missing: bool = False
    counts: Counter[str] = field(default_factory=Counter)
    repeats: int = 0
    others: int = 0

    def __post_init__(self) -> None:
        self.seen = Seen(self.limit)

    def handle(self, record: ConsumedRecord) -> Outcome | None:
        """What became of ``record``'s event; ``None`` when the record is not acted on
        (another consumer's, another event's, a repeat)."""
        found = read_dead_letter(record, self.consumer, self.event_ids)
        if found is None:
            self.others += 1
            return None
        known = None if found.event_id is None else self.seen.get(found.event_id)
        problem = None if isinstance(found, Unusable) else self.allowed.problem(found.source_topic)
        if known or (known is False and (isinstance(found, Unusable) or problem is not None)):
            self.repeats += 1
            return None
        if isinstance(found, Unusable):
            if found.event_id is not None:
                self.seen.put(found.event_id, False)
            return self._count(unusable_outcome(found))
        if problem is not None:  # a dead letter naming an allowed topic may still follow
            self.seen.put(found.event_id, False)
            detail = f"{problem} (dlq-source topic {found.source_topic!r})"
            return self._count(Outcome(found.event_id, found.where, NOT_ALLOWED, detail))
        self.seen.put(found.event_id, True)
        outcome = replay_one(
            found,
            state_of=self.state_of,
            forget=self.forget,
            publish=self.publish,
            dry_run=self.dry_run,
            publish_missing=self.publish_missing,
        )
        return self._count(outcome)

    def _count(self, outcome: Outcome) -> Outcome:
        self.counts[outcome.action] += 1
        return outcome

    @property
    def failed(self) -> int:
        return self.counts[FAILED]


__all__ = [
    "DeadLetter",
    "Outcome",
    "Replay",
    "Seen",
    "Step",
    "Targets",
    "Unusable",
    "decide",
    "read_dead_letter",
    "replay_one",
    "source_of",
    "source_topic",
    "targets",
]
