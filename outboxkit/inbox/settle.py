"""Settling an outcome: its acknowledgement, then its offset, or a hold on its record (sans-IO).

An outcome that advances the offset is committed (or kept for the interval commit) once its
acknowledgement was published or given up (:class:`~outboxkit.inbox.acks.Acknowledger`); one
whose acknowledgement failed holds its record like a retry does: seek back, pause, back-off. In
a batch, the outcomes behind such a record in its partition are not settled (they come again
after it): the batch keeps those partitions itself (``stopped``), since a rebalance callback
during the batch (aiokafka runs them at any await) may clear the gate's holds, and a later
outcome would then commit past the unacknowledged record. A retry among them keeps its back-off.
Once one publish failed, no acknowledgement is tried until the next poll (each try could wait
out the sender's timeout, and a member that does not poll within ``max.poll.interval.ms`` is
dropped from the group): their records are held the same way, batched or one by one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from outboxkit.errors import PublishError
from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.gate import record_mark
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.steps import Commit, Pause, Plan, Seek
from outboxkit.kafka.api import TopicPartition

if TYPE_CHECKING:
    from outboxkit.inbox.loop import ConsumerLoop

logger = logging.getLogger("outboxkit.inbox.consumer")

#: How soon a record held because its acknowledgement was not published is delivered again.
ACK_RETRY_SECONDS = 1.0


def settled_quietly(loop: ConsumerLoop, env: Envelope, outcome: Outcome) -> bool:
    """The part of :func:`settle` that takes no step (an offset to commit later, no
    acknowledgement to publish), done at once; whether the outcome was that case."""
    if loop.pending is None or loop.acks is not None:
        return False
    if not outcome.kind.advances_offset:
        return False
    tp = (env.topic, env.partition)
    if tp in loop.assigned:
        loop.pending.settle(tp, env.offset + 1)
    return True


def settle(
    loop: ConsumerLoop,
    env: Envelope,
    outcome: Outcome,
    stopped: set[TopicPartition] | None = None,
) -> Plan[None]:
    """Commit past ``env``, or hold it. ``stopped``: the partitions of this batch whose offset
    stays behind a record held for its acknowledgement (read and added to)."""
    tp = (env.topic, env.partition)
    if stopped and tp in stopped:  # behind a record held for its acknowledgement: comes again
        if not outcome.kind.advances_offset:
            loop.gate.defer(tp, loop.clock() + outcome.retry_in)
        return
    if settled_quietly(loop, env, outcome):
        return
    retry_in, event_id, ack = outcome.retry_in, outcome.event_id, None
    if outcome.kind.advances_offset:
        if loop.acks is not None and loop.acks.failing:  # one failed since the last poll
            ack = loop.acks.unsent(env, outcome)
        elif loop.acks is not None:
            ack = yield from loop.acks.acknowledge(env, outcome)
        if ack is None:
            if tp not in loop.assigned:
                return  # revoked meanwhile (aiokafka may rebalance at any await): not ours
            if loop.pending is None:
                yield from commit({tp: env.offset + 1})
            else:
                loop.pending.settle(tp, env.offset + 1)
            return
        # Not acknowledged: held, and delivered again (a duplicate, acknowledged again).
        retry_in, event_id = ACK_RETRY_SECONDS, None
        if stopped is not None:
            stopped.add(tp)  # held or not (revoked meanwhile), nothing behind it is settled
    if tp in loop.revoked or tp not in loop.assigned:
        return  # its new owner takes it from the committed offset
    yield Seek(tp, env.offset)
    yield Pause([tp])
    loop.drop([tp])
    mark = record_mark(env.timestamp_ms, env.key, env.value, env.raw_headers)
    loop.gate.hold(tp, env.offset, loop.clock() + retry_in, event_id, ack, mark)


def commit(offsets: Mapping[TopicPartition, int]) -> Plan[None]:
    if not offsets:
        return
    try:
        yield Commit(offsets)
    except PublishError as exc:  # the database holds the outcomes: a redelivery is known
        logger.warning("offset commit failed (redelivery will be deduplicated): %s", exc)
