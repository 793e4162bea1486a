"""Acknowledgement records: how an event ended for a consumer, published for its producer.

Optional (``acks_topic=`` on an adapter). One JSON record per terminal outcome, keyed by event
id, published and flushed before the offset commit — so at least once; readers deduplicate by
``(consumer, event_id)``. A delivery that finds its event finished (a duplicate) acknowledges
the outcome as recorded again: the delivery that finished it may have died, or lost its
partition, before acknowledging it. A publish that fails holds the record (its offset is not
committed) and its redelivery, a duplicate, acknowledges it; after a few failures for the same
record (or one no retry can fix) the acknowledgement is given up with an error, so no partition
is held for ever (:class:`Acknowledger`). A held record that leaves the log before it is
delivered again has its acknowledgement published from the hold (:func:`publish_gone`). The
outcome stays in the database either way.

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
from dataclasses import dataclass

from outboxkit.errors import PermanentPublishError, PublishError, SendStoppedError
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
#: Failure counts of acknowledgements kept, the oldest dropped beyond: a count outlives the
#: rebalances (the bound holds for a partition that moves between members), not the process.
ACK_FAILURES_KEPT = 4096


@dataclass(frozen=True)
class HeldAck:
    """An acknowledgement whose publish failed, kept with its record's hold: published from
    here if that record leaves the log before a delivery acknowledges it again."""

    event_id: str
    record: AckRecord


def ack_record(consumer: str, env: Envelope, outcome: Outcome) -> AckRecord | None:
    """``(key, value, headers)`` for the acks topic, or ``None`` if nothing is acknowledged."""
    if outcome.event_id is None:
        return None
    attempts, error = outcome.attempts, outcome.error
    if outcome.kind is OutcomeKind.DUPLICATE:
        if outcome.recorded is None:
            return None
        recorded, attempts, error = outcome.recorded
        state = _RECORDED.get(recorded)
        if state is None:
            return None
        if state is OutcomeKind.SUCCEEDED:
            error = None  # as its first acknowledgement said (the row may keep an earlier one)
    elif outcome.kind not in _ACKED:
        return None
    else:
        state = OutcomeKind.DEAD if outcome.row_dead else outcome.kind
    return acknowledgement(
        consumer,
        outcome.event_id,
        state,
        attempts,
        error,
        (env.topic, env.partition, env.offset),
        rejection_log=outcome.rejection_log and not outcome.row_dead,
    )


class Acknowledger:
    """Publishes the loop's acknowledgements; says whether the offset may move past a record.

    A failed publish answers a :class:`HeldAck`: the loop holds the record (seek back, pause,
    back-off) and its redelivery, a duplicate by then, acknowledges again. ``attempts`` failed
    publishes for the same record, or one a retry cannot fix (:class:`PermanentPublishError`: a
    missing topic, no ACL), give it up with an error: no record holds its partition for ever.
    The counts survive rebalances (else frequent ones would keep the bound from being reached),
    at most :data:`ACK_FAILURES_KEPT` of them.
    """

    def __init__(self, consumer: str, topic: str, attempts: int) -> None:
        self.consumer = consumer
        self.topic = topic
        self.attempts = attempts
        self.failures: dict[Where, int] = {}  # failed publishes of a record's acknowledgement
        # A publish failed since the last poll: the next are not tried (:meth:`unsent`) until
        # one comes (each try may wait out the sender's timeout, with no poll in between).
        self.failing = False

    def acknowledge(self, env: Envelope, outcome: Outcome) -> Plan[HeldAck | None]:
        """``None`` if the offset may move past ``env`` (published, nothing to, or given up),
        else what its hold keeps."""
        record = ack_record(self.consumer, env, outcome)
        if record is None or outcome.event_id is None:
            return None
        where = (env.topic, env.partition, env.offset)
        try:
            yield Publish(self.topic, *record)
        except SendStoppedError:  # held, not counted: a stop is not the record's failure
            return HeldAck(outcome.event_id, record)
        except PublishError as exc:
            self.failing = True
            count = self.failures.pop(where, 0) + 1  # counted again: the newest, kept longest
            if count < self.attempts and not isinstance(exc, PermanentPublishError):
                self.failures[where] = count
                if len(self.failures) > ACK_FAILURES_KEPT:
                    del self.failures[next(iter(self.failures))]
                logger.warning(
                    "acknowledgement for %s not published (%d of %d): %s; its record is held"
                    " and acknowledged again when delivered again",
                    outcome.event_id,
                    count,
                    self.attempts,
                    exc,
                )
                return HeldAck(outcome.event_id, record)
            why = f"after {count} failed publish(es)"
            _gave_up(self.consumer, outcome.event_id, where, why, exc)
            return None
        if self.failures:
            self.failures.pop(where, None)
        return None

    def unsent(self, env: Envelope, outcome: Outcome) -> HeldAck | None:
        """What a hold keeps for ``env`` when its publish is not tried (one failed since the
        last poll: :attr:`failing`); not counted as a failure of its own. ``None``: nothing to
        acknowledge."""
        record = ack_record(self.consumer, env, outcome)
        if record is None or outcome.event_id is None:
            return None
        return HeldAck(outcome.event_id, record)

    def drop(self, where: Where) -> None:
        """The record's acknowledgement goes another way (its record left the log)."""
        self.failures.pop(where, None)


class GoneBudget:
    """The failed publishes one round of gone records' acknowledgements may wait out (each up
    to the sender's timeout), however many records it has: no poll comes in between, and the
    group drops a member that does not poll within ``max.poll.interval.ms``."""

    def __init__(self) -> None:
        self.left = GONE_ACK_ATTEMPTS
        self.last: PublishError | None = None


def publish_gone(
    topic: str,
    consumer: str,
    event_id: str,
    record: AckRecord,
    where: Where,
    budget: GoneBudget | None = None,
) -> Plan[None]:
    """Publish the acknowledgement of a record no delivery will ever bring again: tried again
    at once while ``budget`` lasts (:data:`GONE_ACK_ATTEMPTS` failures, shared by the records
    of one round), then given up with an error."""
    budget = GoneBudget() if budget is None else budget
    failed = 0
    while budget.left > 0:
        try:
            yield Publish(topic, *record)
            return
        except PermanentPublishError as exc:
            _gave_up(consumer, event_id, where, f"after {failed + 1} failed publish(es)", exc)
            return
        except SendStoppedError as exc:  # no later try: the rest of the round is given up too
            budget.left, budget.last = 0, exc
            _gave_up(consumer, event_id, where, "as the consumer stops", exc)
            return
        except PublishError as exc:
            failed, budget.left, budget.last = failed + 1, budget.left - 1, exc
            if budget.left > 0:
                logger.warning("acknowledgement for %s not published: %s", event_id, exc)
    why = f"after {failed} failed publish(es)" if failed else "untried (publishes just failed)"
    _gave_up(consumer, event_id, where, why, budget.last)


def _gave_up(
    consumer: str, event_id: str | None, where: Where, why: str, exc: Exception | None
) -> None:
    logger.error(
        "acknowledgement for %s (%s/%d at offset %d) given up %s: %s;"
        " its outcome is in the database: outboxkit inbox show --consumer %s --event-id %s",
        event_id,
        *where,
        why,
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
