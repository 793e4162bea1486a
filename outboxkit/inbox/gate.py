"""Per-partition retry holds: a failed message blocks only its own partition, in order.

After a failure the adapter pauses the partition and seeks back to the failed offset; the gate
remembers when to resume. Until then, messages of that partition that were already fetched are
dropped (the seek delivers them again), so order is kept and the consumer never leaves its
group. Once resumed (and sought back again), the first message of the partition at or after
the failed offset ends the hold: the failed one itself, or, if it left the log meanwhile
(retention, compaction, ``delete_records``), the first one Kafka still has. Waiting for that
offset alone would hold the partition for good; the gone record's event ends ``dead``, with the
reason, and is acknowledged so (:func:`end_gone`); a record held for its acknowledgement (whose
publish failed) has that published then instead. A client that keeps refusing the seek back
is replaced (:meth:`PartitionGate.seek_failed`). Pure logic: the clock is passed in.

The log a hold refers to may be gone as a whole (its topic deleted and created again, or an
unclean truncation): its end is then at or before the held offset (:mod:`.resume` asks), or the
record at the held offset is another one (its :func:`record_mark` differs). The held record is
gone then too, and the new log is read from its start: none of it was processed, and the hold's
offset means nothing there. A partition that goes on below the held offset after the seek back
is no proof (a client resets its position on a live log too): the seek back is made again, with
the bounds read first.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Set
from dataclasses import dataclass, replace
from hashlib import blake2b

from outboxkit.db import Result
from outboxkit.inbox.acks import GoneBudget, HeldAck, acknowledgement, publish_gone
from outboxkit.inbox.guard import error_text
from outboxkit.inbox.outcome import OutcomeKind
from outboxkit.inbox.steps import Plan
from outboxkit.inbox.store import LOG_REPLACED, InboxStatements
from outboxkit.kafka.api import ConsumedRecord

TopicPartitionKey = tuple[str, int]

logger = logging.getLogger("outboxkit.inbox.consumer")

#: How soon a resume whose seek back to the held record failed is tried again.
SEEK_RETRY_SECONDS = 1.0
#: Failed seeks back to one held record in a row after which the consumer rejoins its group.
SEEK_ATTEMPTS = 5


def record_mark(
    timestamp_ms: int | None,
    key: bytes | None,
    value: bytes | None,
    headers: tuple[tuple[str, bytes | None], ...],
) -> bytes:
    """What tells the held record from another one at its offset in a new log: a digest of
    all it carries (the same record always gives the same mark; a copy made in the same
    millisecond with the same content is the same event, and may run as the held one)."""
    digest = blake2b(digest_size=16)
    stamp = timestamp_ms if timestamp_ms is not None and timestamp_ms >= 0 else -1
    for part in (str(stamp).encode(), key, value):
        digest.update(b"-" if part is None else b"+%d:" % len(part) + part)
    for name, raw in headers:
        encoded = name.encode("utf-8", "surrogateescape")
        digest.update(b"h%d:" % len(encoded) + encoded)
        digest.update(b"-" if raw is None else b"+%d:" % len(raw) + raw)
    return digest.digest()


def without(records: deque[ConsumedRecord], gone: Set[TopicPartitionKey]) -> deque[ConsumedRecord]:
    """The records of other partitions than ``gone`` (the same deque if none is dropped)."""
    if any((r.topic, r.partition) in gone for r in records):
        return deque(r for r in records if (r.topic, r.partition) not in gone)
    return records


@dataclass
class Hold:
    offset: int
    due: float
    event_id: str | None
    resumed: bool = False
    refused: int = 0  # failed seeks back to ``offset`` in a row
    ack: HeldAck | None = None  # held for its acknowledgement (``event_id`` is ``None``)
    mark: bytes | None = None  # the held record's :func:`record_mark`
    sought: bool = False  # this client sought back to ``offset`` and resumed the partition
    rewind: bool = False  # the log was replaced: resume at its start, then the hold ends
    rechecks: int = 0  # seeks back made again: the partition went on below ``offset``


@dataclass(frozen=True)
class Gone:
    """A held record that left the log: its event will not be delivered again from here."""

    partition: TopicPartitionKey
    offset: int
    event_id: str
    ack: HeldAck | None = None  # its event finished: only this acknowledgement is left to do
    replaced: bool = False  # the whole log went (a topic recreated), not only this record


class PartitionGate:
    def __init__(self) -> None:
        self._holds: dict[TopicPartitionKey, Hold] = {}
        self._gone: list[Gone] = []

    def hold(
        self,
        tp: TopicPartitionKey,
        offset: int,
        due: float,
        event_id: str | None = None,
        ack: HeldAck | None = None,
        mark: bytes | None = None,
    ) -> None:
        self._holds[tp] = Hold(offset, due, event_id, ack=ack, mark=mark)

    def defer(self, tp: TopicPartitionKey, due: float) -> None:
        """Resume the held partition no sooner than ``due``: a retry behind its held record
        keeps its back-off (its record comes again after the held one)."""
        hold = self._holds.get(tp)
        if hold is not None and not hold.resumed and not hold.rewind and hold.due < due:
            hold.due = due

    def due(self, now: float) -> list[tuple[TopicPartitionKey, int]]:
        """Partitions whose back-off has elapsed: resume them (and seek to the offset)."""
        ready = []
        for tp, hold in self._holds.items():
            if not hold.resumed and hold.due <= now:
                hold.resumed = True
                ready.append((tp, hold.offset))
        return ready

    def accept(
        self,
        tp: TopicPartitionKey,
        offset: int,
        mark: bytes | None = None,
        record: ConsumedRecord | None = None,
    ) -> bool:
        """Whether a fetched message may be processed now. The caller drops what it fetched of
        a partition before resuming it, so after the resume only what the seek delivers is
        judged: a later offset there means the failed one is gone, not that it was skipped;
        another record at the held offset (``mark``, else that of ``record``, the message,
        digested only there), that the whole log was replaced; an earlier one after this
        client's own seek, that the seek back is made again."""
        hold = self._holds.get(tp)
        if hold is None:
            return True
        if not hold.resumed or hold.rewind:
            return False
        if offset < hold.offset:
            if hold.sought:
                self._recheck(tp, hold, offset)
            return False
        if mark is None and record is not None and offset == hold.offset:
            mark = record_mark(record.timestamp_ms, record.key, record.value, record.headers)
        if offset == hold.offset and None not in (mark, hold.mark) and mark != hold.mark:
            logger.warning(
                "%s/%d: the record at held offset %d is another one (%s); reading the"
                " partition again from its start",
                *tp,
                hold.offset,
                LOG_REPLACED,
            )
            self._end(tp, hold, replaced=True)
            self._holds[tp] = replace(hold, due=float("-inf"), resumed=False, rewind=True)
            return False
        if offset > hold.offset:
            logger.warning(
                "%s/%d: held record at offset %d is gone; resuming at %d",
                *tp,
                hold.offset,
                offset,
            )
            self._end(tp, hold)
        else:
            del self._holds[tp]
        return True

    def _recheck(self, tp: TopicPartitionKey, hold: Hold, offset: int) -> None:
        """After this client's seek back the partition went on below the held offset: its
        position was reset. A replaced log does that, but so can a live one (an offset out of
        range for a moment, a follower behind): not proof enough to end the held record's row.
        The seek back is made again at once, the log's bounds read first (they, or the record
        at the held offset, tell a replaced log); what comes meanwhile is dropped."""
        log = logger.warning if hold.rechecks == 0 else logger.debug
        log(
            "%s/%d: after the seek back to held offset %d the partition went on at %d; seeking"
            " back again",
            *tp,
            hold.offset,
            offset,
        )
        self._holds[tp] = replace(
            hold, due=float("-inf"), resumed=False, sought=False, rechecks=hold.rechecks + 1
        )

    def _end(self, tp: TopicPartitionKey, hold: Hold, replaced: bool = False) -> None:
        """The held record is gone: its row (or acknowledgement) is ended later."""
        if hold.rewind:
            pass  # reported when the rewind was decided
        elif hold.event_id is not None:
            self._gone.append(Gone(tp, hold.offset, hold.event_id, replaced=replaced))
        elif hold.ack is not None:
            self._gone.append(Gone(tp, hold.offset, hold.ack.event_id, hold.ack, replaced))
        self._holds.pop(tp, None)

    def get(self, tp: TopicPartitionKey) -> Hold | None:
        return self._holds.get(tp)

    def sought(self, tp: TopicPartitionKey) -> None:
        """This client sought back to the held offset and resumes the partition from there."""
        hold = self._holds.get(tp)
        if hold is not None:
            hold.sought = True

    def restart(self, tp: TopicPartitionKey, start: int, end: int | None) -> None:
        """The partition is read again from its log's ``start``: the hold ends (its record gone
        with the log, reported unless a rewind already did; ``end``: the log's, if known)."""
        hold = self._holds.get(tp)
        if hold is None:
            return
        if not hold.rewind:
            logger.warning(
                "%s/%d: held record at offset %d is gone: the partition's log ends at %s (%s);"
                " resuming at its start, %d",
                *tp,
                hold.offset,
                "?" if end is None else str(end),
                LOG_REPLACED,
                start,
            )
        self._end(tp, hold, replaced=True)

    def take_gone_acks(self) -> list[Gone]:
        """Of the records found gone, those held only for their acknowledgement: published at
        once, before anything behind them is committed (their rows are finished: no copy of
        the event behind them has to run first)."""
        acks = [g for g in self._gone if g.ack is not None]
        if acks:
            self._gone = [g for g in self._gone if g.ack is None]
        return acks

    def take_gone(self) -> list[Gone]:
        """The held records found gone since the last call (their rows are still processing)."""
        gone, self._gone = self._gone, []
        return gone

    def seek_failed(self, tp: TopicPartitionKey, now: float) -> bool:
        """The seek back to the held record failed: stay paused, try again shortly. After
        :data:`SEEK_ATTEMPTS` failures in a row, ``True``: retrying may never end (the client
        can be stuck), so the caller replaces the client, whose new member starts from the
        committed offset, at or before the held record (nothing behind it was committed)."""
        hold = self._holds[tp]
        refused = hold.refused + 1
        retry = now + SEEK_RETRY_SECONDS  # still paused, whatever the caller does
        self._holds[tp] = replace(hold, due=retry, resumed=False, refused=refused)
        if refused < SEEK_ATTEMPTS:
            logger.warning(
                "%s/%d: could not seek back to held offset %d; trying again in %g s",
                *tp,
                hold.offset,
                SEEK_RETRY_SECONDS,
            )
            return False
        logger.warning(
            "%s/%d: could not seek back to held offset %d %d times; rejoining the group"
            " with a new client, which delivers it again from the committed offset",
            *tp,
            hold.offset,
            refused,
        )
        return True

    def carry(self, tps: Set[TopicPartitionKey], now: float) -> dict[TopicPartitionKey, Hold]:
        """The holds of ``tps``, for the client that replaces this one (which starts at the held
        offsets): a hold whose back-off elapsed counts as resumed there (its record comes next,
        or, gone, the first one after it); the others keep their due time."""
        return {
            tp: replace(
                h,
                resumed=(h.resumed or h.refused > 0 or h.due <= now) and not h.rewind,
                refused=0,
                sought=False,
            )
            for tp, h in self._holds.items()
            if tp in tps
        }

    def restore(self, tp: TopicPartitionKey, hold: Hold) -> None:
        self._holds[tp] = hold

    def next_due(self) -> float | None:
        pending = [h.due for h in self._holds.values() if not h.resumed]
        return min(pending) if pending else None

    def forget(self, tps: list[TopicPartitionKey]) -> None:
        """Drop holds of revoked partitions (their new owner starts from the committed offset)."""
        for tp in tps:
            self._holds.pop(tp, None)

    @property
    def held(self) -> frozenset[TopicPartitionKey]:
        return frozenset(self._holds)


def end_gone(
    gone: list[Gone], statements: InboxStatements, acks_topic: str | None = None
) -> Plan[None]:
    """End the rows of held records that left the log ``dead``, with the reason. Run after the
    records behind them were processed, so a copy of the event there (which takes the row over
    and names its own offset) runs instead. A failure is logged: the row stays processing.
    A row ended here is acknowledged ``dead`` on ``acks_topic``, a record held for its
    acknowledgement has that published: no delivery of it ever will, so a failed publish is
    tried again at once, a few times in all (:func:`~.acks.publish_gone`)."""
    budget = GoneBudget()
    for g in gone:
        if g.ack is not None:
            if acks_topic is not None:
                where, record = (*g.partition, g.offset), g.ack.record
                consumer = statements.consumer
                yield from publish_gone(acks_topic, consumer, g.event_id, record, where, budget)
            continue
        step = statements.abandon_gone(g.event_id, *g.partition, g.offset, g.replaced)
        try:
            ended: Result = yield step
        except Exception as exc:
            logger.warning(
                "%s/%d: ending event %s failed: %s", *g.partition, g.event_id, error_text(exc)
            )
            continue
        if acks_topic is None or not ended.rows:  # no row: a copy took it over, or it finished
            continue
        where = (*g.partition, g.offset)
        error, attempts = str(step.params["error"]), int(ended.rows[0][0])
        record = acknowledgement(
            statements.consumer, g.event_id, OutcomeKind.DEAD, attempts, error, where
        )
        yield from publish_gone(acks_topic, statements.consumer, g.event_id, record, where, budget)
