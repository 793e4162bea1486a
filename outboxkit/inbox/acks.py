"""Acknowledgement records: how an event ended for a consumer, published for its producer.

Optional (``acks_topic=`` on an adapter). One JSON record per terminal outcome, keyed by event
id, published and flushed before the offset commit — so at least once; readers deduplicate by
``(consumer, event_id)``. A delivery that finds its event finished (a duplicate) acknowledges
the outcome as recorded again: the delivery that finished it may have died, or lost its
partition, before acknowledging it. A publish that fails holds the record (its offset is not
committed) and its redelivery, a duplicate, acknowledges it; after a few failures for the same
record (or one no retry can fix) the acknowledgement is given up with an error, so no partition
is held for ever (:class:`Acknowledger`). The outcome stays in the database either way.

A delivery refused into the rejection log (a reused id, a replay older than the dedup window, an
unsafe header, given up) says nothing of the event's own row, which may be ``succeeded``: its
record carries ``"rejection_log": true`` so a reader does not take ``rejected`` for the event's
state. The field is absent otherwise (records of older versions lack it too). A delivery given up
whose unfinished row was marked ``dead`` is acknowledged ``dead``: that is the event's state, and
no other record would ever tell the producer. So is an event whose record, held for a retry, left
the log (:func:`~outboxkit.inbox.gate.end_gone`): its record is never delivered again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from outboxkit.errors import PermanentPublishError, PublishError
from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.outcome import Outcome, OutcomeKind
from outboxkit.inbox.steps import Plan, Publish
from outboxkit.wire import HEADER_CONTENT_TYPE, HEADER_EVENT_ID, JSON_CONTENT_TYPE

logger = logging.getLogger("outboxkit.inbox.consumer")

_ACKED = {
    OutcomeKind.SUCCEEDED,
    OutcomeKind.DEAD,
    OutcomeKind.REJECTED,
    OutcomeKind.CANCELLED,
}
# A duplicate's recorded state (``inbox_message.state``), acknowledged as the outcome it names.
_RECORDED = {kind.value: kind for kind in _ACKED}

AckRecord = tuple[bytes, bytes, list[tuple[str, bytes]]]
Where = tuple[str, int, int]  # (topic, partition, offset) of a record

#: Publishes of one acknowledgement tried in a row for a held record that left the log: nothing
#: delivers it again, so no later try would come (:func:`~outboxkit.inbox.gate.end_gone`).
GONE_ACK_ATTEMPTS = 3


def ack_record(consumer: str, env: Envelope, outcome: Outcome) -> AckRecord | None:
    """``(key, value, headers)`` for the acks topic, or ``None`` if nothing is acknowledged."""
    if outcome.event_id is None:
        return None
    error = outcome.error
    if outcome.kind is OutcomeKind.DUPLICATE:
        recorded = _RECORDED.get(outcome.recorded or "")
        if recorded is None:
            return None
        # As its first acknowledgement said: a succeeded event carries no error (its row may
        # keep the error of an earlier attempt).
        state, error = recorded, None if recorded is OutcomeKind.SUCCEEDED else error
    elif outcome.kind not in _ACKED:
        return None
    else:
        state = OutcomeKind.DEAD if outcome.row_dead else outcome.kind
    return acknowledgement(
        consumer,
        outcome.event_id,
        state,
        outcome.attempts,
        error,
        (env.topic, env.partition, env.offset),
        rejection_log=outcome.rejection_log and not outcome.row_dead,
    )


class Acknowledger:
    """Publishes the loop's acknowledgements; says whether the offset may move past a record.

    A failed publish answers ``False``: the loop holds the record (seek back, pause, back-off)
    and its redelivery, a duplicate by then, acknowledges again. ``attempts`` failed publishes
    for the same record, or one a retry cannot fix (:class:`PermanentPublishError`: a missing
    topic, no ACL), give it up with an error: no record holds its partition for ever.
    """

    def __init__(self, consumer: str, topic: str, attempts: int) -> None:
        self.consumer = consumer
        self.topic = topic
        self.attempts = attempts
        self.failures: dict[Where, int] = {}  # failed publishes of a record's acknowledgement

    def acknowledge(self, env: Envelope, outcome: Outcome) -> Plan[bool]:
        """Whether the offset may move past ``env``: published, nothing to, or given up."""
        record = ack_record(self.consumer, env, outcome)
        if record is None:
            return True
        where = (env.topic, env.partition, env.offset)
        try:
            yield Publish(self.topic, *record)
        except PublishError as exc:
            count = self.failures[where] = self.failures.get(where, 0) + 1
            if count < self.attempts and not isinstance(exc, PermanentPublishError):
                logger.warning(
                    "acknowledgement for %s not published (%d of %d): %s; its record is held"
                    " and acknowledged again when delivered again",
                    outcome.event_id,
                    count,
                    self.attempts,
                    exc,
                )
                return False
            self.failures.pop(where, None)
            _gave_up(self.consumer, outcome.event_id, where, count, exc)
            return True
        if self.failures:
            self.failures.pop(where, None)
        return True

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Partitions revoked or assigned anew: their new owner counts its own failures."""
        gone = set(partitions)
        for where in [w for w in self.failures if w[:2] in gone]:
            del self.failures[where]


def publish_gone(
    topic: str, consumer: str, event_id: str, record: AckRecord, where: Where
) -> Plan[None]:
    """Publish the acknowledgement of a record no delivery will ever bring again: tried
    :data:`GONE_ACK_ATTEMPTS` times in a row (each waits out the sender's timeout), then given
    up with an error."""
    for attempt in range(1, GONE_ACK_ATTEMPTS + 1):
        try:
            yield Publish(topic, *record)
            return
        except PermanentPublishError as exc:
            _gave_up(consumer, event_id, where, attempt, exc)
            return
        except PublishError as exc:
            if attempt == GONE_ACK_ATTEMPTS:
                _gave_up(consumer, event_id, where, attempt, exc)
                return
            logger.warning("acknowledgement for %s not published: %s", event_id, exc)


def _gave_up(
    consumer: str, event_id: str | None, where: Where, attempts: int, exc: Exception
) -> None:
    logger.error(
        "acknowledgement for %s (%s/%d at offset %d) given up after %d failed publish(es): %s;"
        " its outcome is in the database: outboxkit inbox show --consumer %s --event-id %s",
        event_id,
        *where,
        attempts,
        exc,
        consumer,
        event_id,
    )


def acknowledgement(
    consumer: str,
    event_id: str,
    state: OutcomeKind,
    attempts: int,
    error: str | None,
    record: tuple[str, int, int],
    *,
    rejection_log: bool = False,
) -> AckRecord:
    """The one shape of every acknowledgement; ``record`` is ``(topic, partition, offset)`` of
    the delivery it is about (also for one no outcome stands for: a held record gone)."""
    topic, partition, offset = record
    body: dict[str, object] = {
        "consumer": consumer,
        "event_id": event_id,
        "state": state.value,
        "attempts": attempts,
        "error": error,
        "topic": topic,
        "partition": partition,
        "offset": offset,
    }
    if rejection_log:
        body["rejection_log"] = True
    headers = [
        (HEADER_EVENT_ID, event_id.encode()),
        (HEADER_CONTENT_TYPE, JSON_CONTENT_TYPE.encode()),
    ]
    return event_id.encode(), json.dumps(body).encode(), headers
