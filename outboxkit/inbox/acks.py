"""Acknowledgement records: how an event ended for a consumer, published for its producer.

Optional (``acks_topic=`` on an adapter). One JSON record per terminal outcome reached by this
delivery (duplicates are not re-acknowledged), keyed by event id, published and flushed before
the offset commit — so at least once; readers deduplicate by ``(consumer, event_id)``.

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

from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.outcome import Outcome, OutcomeKind
from outboxkit.wire import HEADER_CONTENT_TYPE, HEADER_EVENT_ID, JSON_CONTENT_TYPE

_ACKED = {
    OutcomeKind.SUCCEEDED,
    OutcomeKind.DEAD,
    OutcomeKind.REJECTED,
    OutcomeKind.CANCELLED,
}

AckRecord = tuple[bytes, bytes, list[tuple[str, bytes]]]


def ack_record(consumer: str, env: Envelope, outcome: Outcome) -> AckRecord | None:
    """``(key, value, headers)`` for the acks topic, or ``None`` if nothing is acknowledged."""
    if outcome.kind not in _ACKED or outcome.event_id is None:
        return None
    state = OutcomeKind.DEAD if outcome.row_dead else outcome.kind
    return acknowledgement(
        consumer,
        outcome.event_id,
        state,
        outcome.attempts,
        outcome.error,
        (env.topic, env.partition, env.offset),
        rejection_log=outcome.rejection_log and not outcome.row_dead,
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
