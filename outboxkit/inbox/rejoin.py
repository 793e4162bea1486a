"""Replacing a client that keeps refusing the seek back to a held record (sans-IO).

The new member starts each partition at its committed offset. So the held offsets are committed
first (every record before a held one is settled): a group with none yet would start where
``auto.offset.reset`` says, with ``latest`` past the held record and everything behind it. Should
that commit fail, the client is kept (still paused; the seek is tried again, then the rejoin);
after :data:`COMMIT_ATTEMPTS` failures the rejoin goes ahead all the same if the policy is
``earliest`` (a committed offset is at or before the held record; with none the new member
starts at the log's start), never with another policy (a stuck client must not skip records).
The holds and the failure counts of this member go over to the new client's first assignment: a
held record that left the log still ends ``dead`` (:func:`~outboxkit.inbox.gate.end_gone`), one
failing outside its handler is still given up after ``max_unexpected_errors``, and a hold whose
back-off runs on keeps it. Another member of the group may have had a held partition meanwhile,
run the held record and committed past it: a hold whose partition's committed offset (read on
the first step after the assignment, not in the rebalance callback) is past the held offset is
dropped, since seeking back would run what that member settled again, and resuming would take
the next record for a sign that the held one left the log. Until the new client has its first
assignment nothing is processed: the rejoin polls it, keeping what it fetches for after the
holds are settled. A subscribe that fails (Kafka away) is tried again, backing off; any other
error (a configuration the client refuses) ends ``run()``, as it would have ended ``start()``.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

from outboxkit.errors import PublishError
from outboxkit.inbox.gate import Gone, Hold, TopicPartitionKey, end_gone
from outboxkit.inbox.guard import error_text
from outboxkit.inbox.steps import (
    CloseConsumer,
    Commit,
    Committed,
    Pause,
    Plan,
    Poll,
    Sleep,
    Subscribe,
)

if TYPE_CHECKING:
    from outboxkit.inbox.loop import ConsumerLoop

logger = logging.getLogger("outboxkit.inbox.consumer")

# The new client cannot join (Kafka away): try again after this long, doubling up to the maximum.
RESUBSCRIBE_RETRY_SECONDS = 0.5
RESUBSCRIBE_RETRY_MAX_SECONDS = 5.0
# Rejoins given up because committing the held offsets failed before one goes ahead without
# that commit (only with auto.offset.reset=earliest).
COMMIT_ATTEMPTS = 3
# How long reading the committed offsets of the held partitions may take before the holds are
# kept as they were (as if no other member had had them).
COMMITTED_READ_SECONDS = 10.0


class Rejoin:
    def __init__(self) -> None:
        self.closed = False  # the old client is closed; the new one has not subscribed yet
        self._pause = RESUBSCRIBE_RETRY_SECONDS
        self._carried = False  # holds and failures wait for the new client's first assignment
        self._holds: dict[TopicPartitionKey, Hold] = {}
        self._failures: dict[tuple[str, int, int], int] = {}
        # Carried holds (and failure counts) of partitions the new client got, until their
        # committed offsets are read.
        self._checks: dict[TopicPartitionKey, Hold] = {}
        self._check_failures: dict[tuple[str, int, int], int] = {}
        self._commit_failures = 0  # rejoins given up in a row: committing the held offsets failed

    def run(self, loop: ConsumerLoop, now: float) -> Plan[bool]:
        """Commit the held and settled offsets, close the client, subscribe a new one; whether
        there is a client to poll (``False``: the new one has not subscribed, or has no
        assignment, yet)."""
        assigned = set(loop.assigned)
        holds = loop.gate.carry(assigned, now)
        settled = loop.pending.take(list(assigned)) if loop.pending is not None else {}
        offsets = dict(settled)
        for tp, hold in holds.items():
            offsets[tp] = max(hold.offset, offsets.get(tp, -1))
        try:
            if offsets:
                yield Commit(offsets)
        except PublishError as exc:
            if not self._commit_failed(loop, settled, exc):
                return True
        self._commit_failures = 0
        failures = dict(loop.failures)
        loop.on_revoke(list(assigned))  # what it hands back was committed above
        self.closed = True
        try:
            yield CloseConsumer()
        except Exception as exc:  # the client goes anyway: a new one is created
            logger.warning("closing the client to replace failed: %s", error_text(exc))
        # The old client's callbacks during the commit may have assigned partitions again.
        loop.assigned.clear()
        loop.buffer = deque()
        loop.gate.forget(list(loop.gate.held))
        self._carried, self._holds, self._failures = True, holds, failures
        return (yield from self.ready(loop))

    def _commit_failed(
        self, loop: ConsumerLoop, settled: dict[TopicPartitionKey, int], exc: PublishError
    ) -> bool:
        """Whether to rejoin all the same (see the module); else the settled offsets of the
        partitions still assigned are kept for a later commit."""
        self._commit_failures += 1
        policy = loop.options.offset_reset
        if self._commit_failures >= COMMIT_ATTEMPTS and policy == "earliest":
            logger.warning(
                "committing the held offsets failed %d times (%s); rejoining the group all the"
                " same: with auto.offset.reset=earliest the new member starts at or before the"
                " held records (what was settled since the last commit comes again, recognised)",
                self._commit_failures,
                exc,
            )
            return True
        if loop.pending is not None:
            for tp, offset in settled.items():
                if tp in loop.assigned:  # a partition revoked meanwhile is not ours to commit
                    loop.pending.settle(tp, offset)
        if self._commit_failures >= COMMIT_ATTEMPTS:
            logger.warning(
                "not rejoining the group: committing the held offsets failed %d times (%s) and"
                " with auto.offset.reset=%s a partition without a committed offset would start"
                " the new member past the held record; the seek back is tried again, then the"
                " rejoin (set auto.offset.reset to earliest to rejoin without that commit)",
                self._commit_failures,
                exc,
                policy,
            )
        else:
            logger.warning(
                "not rejoining the group: committing the held offsets failed (%s); the seek"
                " back is tried again, then the rejoin",
                exc,
            )
        return False

    def ready(self, loop: ConsumerLoop) -> Plan[bool]:
        """Whether there is a client to poll: subscribes the new one if it has not yet (on
        failure, waits before the next try), polls it until its first assignment, then takes
        the carried holds over."""
        if self.closed:
            try:
                yield Subscribe(loop.options.topics, loop.on_assign, loop.on_revoke)
            except PublishError as exc:
                if not exc.retriable:
                    raise
                logger.warning(
                    "rejoining the group failed (%s); nothing is consumed until it succeeds,"
                    " trying again in %g s",
                    error_text(exc),
                    self._pause,
                )
                yield Sleep(self._pause)
                self._pause = min(self._pause * 2, RESUBSCRIBE_RETRY_MAX_SECONDS)
                return False
            self.closed, self._pause = False, RESUBSCRIBE_RETRY_SECONDS
        if self._carried:  # no assignment yet: what a poll fetches waits for the holds
            loop.buffer.extend((yield Poll(loop.options.poll_timeout, loop.options.max_records)))
            if self._carried:
                return False
        if self._checks:
            yield from self._take_over(loop)
        return True

    def assigned(self, loop: ConsumerLoop, partitions: list[TopicPartitionKey]) -> None:
        """The new client's first assignment: the carried holds and failure counts of the
        partitions it got wait for their committed offsets (other owners start at them)."""
        for tp in set(partitions) & self._checks.keys():  # assigned again meanwhile: afresh
            del self._checks[tp]
        if not self._carried:
            return
        got = set(partitions)
        self._checks = {tp: hold for tp, hold in self._holds.items() if tp in got}
        failures = {w: n for w, n in self._failures.items() if w[:2] in got}
        loop.failures.update({w: n for w, n in failures.items() if w[:2] not in self._checks})
        self._check_failures = {w: n for w, n in failures.items() if w[:2] in self._checks}
        self._carried, self._holds, self._failures = False, {}, {}

    def _take_over(self, loop: ConsumerLoop) -> Plan[None]:
        """Restore each carried hold, unless its partition's committed offset is past the held
        offset: another member settled the held record (if it had left the log instead, its
        row still processing, it ends ``dead``). A failed read keeps every hold."""
        checks = self._checks
        try:
            committed = yield Committed(sorted(checks), COMMITTED_READ_SECONDS)
            settled = {
                tp: committed[tp]
                for tp, hold in checks.items()
                if tp in committed and committed[tp] > hold.offset
            }
        except Exception as exc:  # the holds are kept: at worst a record runs again
            logger.warning(
                "reading the committed offsets of the held partitions failed (%s); their holds"
                " are kept",
                error_text(exc),
            )
            settled = {}
        self._checks, failures, self._check_failures = {}, self._check_failures, {}
        ours = {tp: hold for tp, hold in checks.items() if tp in loop.assigned}
        gone = []
        for tp, hold in ours.items():
            if tp in settled:
                logger.info(
                    "%s/%d: another member committed offset %d past held offset %d during the"
                    " rejoin; the hold is dropped",
                    *tp,
                    settled[tp],
                    hold.offset,
                )
                if hold.ack is not None:  # held for it: published, as nothing else may
                    gone.append(Gone(tp, hold.offset, hold.ack.event_id, hold.ack))
                    if loop.acks is not None:
                        loop.acks.drop((*tp, hold.offset))
                elif hold.event_id is not None:
                    gone.append(Gone(tp, hold.offset, hold.event_id))
            else:
                loop.gate.restore(tp, hold)
        kept = ours.keys() - settled.keys()
        loop.failures.update({w: n for w, n in failures.items() if w[:2] in kept})
        paused = sorted(tp for tp in kept if not ours[tp].resumed)
        if paused:
            yield Pause(paused)
        # Ends the row only if it still names the held record (it left the log, so the other
        # member never ran it); a row that member settled is left alone, nothing logged.
        yield from end_gone(gone, loop.core.statements, loop.options.acks_topic)
