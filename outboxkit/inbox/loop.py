"""The one consumer loop both adapters drive: gate, offsets, settle, dead letters, acks (sans-IO).

The consumer runs ``read_committed`` with auto-commit off; an offset is committed only after the
handler's transaction committed, or after the event was recorded as duplicate/rejected/dead/
cancelled; with an acks topic, also only after its acknowledgement was published (or given up:
:mod:`outboxkit.inbox.settle`). With ``offset_commit_interval`` the settled offsets
are committed every that many seconds instead (and on revoke and close): fewer round trips, still
safe (a redelivery is recognised). A failed handler pauses its partition and seeks back
(:mod:`outboxkit.inbox.gate`).

Rebalances: a revoked partition's hold and prefetched records are dropped and its settled offsets
committed before it goes; the seam resumes every newly assigned partition (paused ones too).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from outboxkit.db.availability import grant_hint, not_the_records
from outboxkit.inbox.acks import Acknowledger
from outboxkit.inbox.batch import deliver_batch
from outboxkit.inbox.deadletter import dead_letter_record
from outboxkit.inbox.delivery import InboxCore
from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.gate import PartitionGate, end_gone, without
from outboxkit.inbox.guard import error_text
from outboxkit.inbox.loop_options import ERROR_RETRY_SECONDS, LoopOptions
from outboxkit.inbox.offsets import PendingOffsets
from outboxkit.inbox.outcome import Outcome, OutcomeKind
from outboxkit.inbox.rejoin import Rejoin
from outboxkit.inbox.resume import resume_due
from outboxkit.inbox.retention import Purger
from outboxkit.inbox.settle import commit, settle, settled_quietly
from outboxkit.inbox.steps import (
    CloseConsumer,
    CloseSender,
    Plan,
    Poll,
    Publish,
    Subscribe,
)
from outboxkit.inbox.topic_check import check_topics
from outboxkit.kafka.api import ConsumedRecord, TopicPartition
from outboxkit.log_limit import LimitedLines, normalised

logger = logging.getLogger("outboxkit.inbox.consumer")
DATABASE_BACK = "the database works again after %.0f s; processing goes on"
# An outage ends in the log once a record ran and no database-away line came for this long: an
# overloaded server refusing connections now and then is one outage, not many.
OUTAGE_QUIET_SECONDS = 5.0


class ConsumerLoop:
    """Decides every Kafka step of one consumer; the adapters only execute them."""

    def __init__(
        self, core: InboxCore, options: LoopOptions, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.core = core
        self.options = options
        self.clock = clock
        self.gate = PartitionGate()
        interval = options.offset_commit_interval
        self.pending = PendingOffsets(interval, clock()) if interval > 0 else None
        self.buffer: deque[ConsumedRecord] = deque()
        # Taken out of the buffer, not settled yet: what a stop cut short (a cancelled poll, a
        # KeyboardInterrupt) left, put back first by the next poll (the client is past them).
        self.unsettled: dict[tuple[str, int, int], ConsumedRecord] = {}
        self.assigned: set[TopicPartition] = set()
        self.inflight: set[TopicPartition] = set()  # partitions of the records being processed
        self.revoked: set[TopicPartition] = set()  # ... revoked while they were
        self.single = 0  # records to process one by one (after a batch failed unexpectedly)
        self.subscribed = False
        self.failures: dict[tuple[str, int, int], int] = {}
        topic, bound = options.acks_topic, options.max_unexpected_errors
        self.acks = None if topic is None else Acknowledger(core.settings.consumer, topic, bound)
        self.rejoin = Rejoin()  # replaces a client that keeps refusing seeks
        self.outage_log = LimitedLines(logger, clock=clock)  # lines repeated while the DB is away
        self.purger = Purger(
            core.statements.schema,
            options.retention,
            clock(),
            consumer=core.settings.consumer,
            replay_window=core.settings.replay_window,
        )

    # -- rebalance callbacks (the client seam runs them inside its poll) ------------------------
    def on_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned.update(partitions)
        self._forget_failures(partitions)
        self.drop(partitions)  # a hold from an earlier ownership means nothing now
        self.rejoin.assigned(self, partitions)  # ... but one carried over a rejoin does

    def on_revoke(self, partitions: list[TopicPartition]) -> Mapping[TopicPartition, int]:
        """Forget the partitions; returns their settled offsets, to commit before they go."""
        self.revoked.update(self.inflight.intersection(partitions))
        self.assigned.difference_update(partitions)
        self._forget_failures(partitions)
        self.drop(partitions)
        return self.pending.take(partitions) if self.pending is not None else {}

    def _forget_failures(self, partitions: Iterable[TopicPartition]) -> None:
        """Not the acknowledgements' (kept: :class:`~outboxkit.inbox.acks.Acknowledger`)."""
        gone = set(partitions)
        self.failures = {w: n for w, n in self.failures.items() if w[:2] not in gone}

    def drop(self, partitions: Iterable[TopicPartition]) -> None:
        gone = set(partitions)
        self.gate.forget(list(gone))
        self.buffer = without(self.buffer, gone)
        self.unsettled = {k: r for k, r in self.unsettled.items() if k[:2] not in gone}

    def _put_back_unsettled(self) -> None:
        """Before anything else in a poll: what a stop left unsettled comes first, in fetch order,
        or a later settle would commit past records that never ran (their rows ``processing``)."""
        self.buffer.extendleft(reversed(self.unsettled.values()))
        self.unsettled = {}

    # -- plans ------------------------------------------------------------------------------------
    def start(self) -> Plan[bool]:
        """Check the topics published to, then join the group (once); ``False``: stopped first."""
        if not self.subscribed:
            if (yield from self.check_dead_letters()) is None:
                return False
            self.subscribed = True
            yield Subscribe(self.options.topics, self.on_assign, self.on_revoke)
        return True

    def check_dead_letters(self) -> Plan[list[str] | None]:
        """Missing dead-letter topics and acks topic, checked before joining the group
        (``dead_letter_check``: ``"fail"`` raises :class:`ConfigurationError` naming the first,
        ``"warn"`` logs them); ``None``: stopped while waiting for Kafka."""
        options = self.options
        return (
            yield from check_topics(
                options.topics, options.dead_letter, options.acks_topic, options.dead_letter_check
            )
        )

    def run(self, stopped: Callable[[], bool], max_messages: int | None = None) -> Plan[int]:
        """Process until ``stopped()`` (or ``max_messages`` deliveries were settled)."""
        handled = 0
        while not stopped():
            handled += len((yield from self.poll_batch()))
            if max_messages is not None and handled >= max_messages:
                break
        return handled

    def poll_batch(self, timeout: float | None = None) -> Plan[list[Outcome]]:
        """Process up to ``batch_max_records`` records in one transaction (one record when
        batching is off); their outcomes in order."""
        self._put_back_unsettled()
        if self.options.batch_max_records <= 1 or self.single > 0:
            self.single = max(self.single - 1, 0)
            outcome = yield from self.poll_once(timeout)
            return [] if outcome is None else [outcome]
        if not (yield from self._housekeeping()):
            return []
        records = yield from self._take(timeout)
        if self.acks is not None:
            yield from self._gone_acks()
        if not records:
            return []
        envs = [Envelope.from_record(r) for r in records]
        self.inflight, self.revoked = {(e.topic, e.partition) for e in envs}, set()
        began = self.clock()
        try:
            plan = deliver_batch(self.core, envs, self.revoked.__contains__, self._dead_letter)
            result = yield from plan
            self.outage_log.answered()
        except Exception as exc:  # deliver them one by one: each counts its own errors
            text = error_text(exc) + grant_hint(exc)
            kind = ("batch", normalised(text)) if not_the_records(exc) else None
            self._say(logging.WARNING, kind, "batch of %d failed (%s); one by one", len(envs), text)
            self.buffer.extendleft(reversed(records))
            self.unsettled, self.single = {}, len(records)
            self._count_rerun("one_by_one", 1)
            return []
        finally:
            self.inflight = set()
        self._count_rerun("rolled_back", result.reruns)
        self.buffer.extendleft(reversed([records[i] for i in result.rest]))
        for i in result.rest:
            self.unsettled.pop(_where(records[i]), None)
        stopped: set[TopicPartition] = set()  # held for an acknowledgement in this batch
        for env, outcome in result.outcomes:
            if self.failures:
                self.failures.pop((env.topic, env.partition, env.offset), None)
            self._observe(outcome, began)
            if not settled_quietly(self, env, outcome):  # no plan per event when none is needed
                yield from settle(self, env, outcome, stopped)
            self.unsettled.pop((env.topic, env.partition, env.offset), None)
        return [outcome for _, outcome in result.outcomes]

    def _take(self, timeout: float | None) -> Plan[list[ConsumedRecord]]:
        """Up to ``batch_max_records`` records this member may process now (fetch order):
        what is buffered, topped up for at most ``batch_max_ms``."""
        limit, taken = self.options.batch_max_records, list[ConsumedRecord]()
        deadline = self.clock() + self.options.batch_max_ms / 1000.0
        while len(taken) < limit:
            if not self.buffer:
                if taken:
                    wait = deadline - self.clock()
                    if wait <= 0:
                        break
                else:
                    wait = self.options.poll_timeout if timeout is None else timeout
                fetched = yield Poll(wait, max(self.options.max_records, limit))
                if self.acks is not None:
                    self.acks.failing = False  # a poll came: publishes may be tried again
                if taken:  # a rebalance in that poll may have taken partitions of these
                    taken = [r for r in taken if (r.topic, r.partition) in self.assigned]
                if not fetched:
                    break
                self.buffer.extend(fetched)
            record = self.buffer.popleft()
            tp = (record.topic, record.partition)
            if tp in self.assigned and self.gate.accept(tp, record.offset, record=record):
                taken.append(record)
                self.unsettled[_where(record)] = record
        return taken

    def _housekeeping(self) -> Plan[bool]:
        """Join the group; end held records gone; resume due retries (rejoin if a client keeps
        refusing the seek back); commit offsets; purge. ``False``: no client to poll yet."""
        if not (yield from self.start()) or not (yield from self.rejoin.ready(self)):
            return False
        self.outage_log.end(logging.WARNING, DATABASE_BACK, quiet=OUTAGE_QUIET_SECONDS)
        if self.acks is not None:
            yield from self._gone_acks()
        yield from end_gone(self.gate.take_gone(), self.core.statements, self.options.acks_topic)
        now = self.clock()
        rejoin = yield from resume_due(self, now)
        if rejoin and not (yield from self.rejoin.run(self, now)):
            return False
        if self.pending is not None:
            yield from commit(self.pending.due(now))
        yield from self.purger.run_due(now)
        return True

    def poll_once(self, timeout: float | None = None) -> Plan[Outcome | None]:
        """Process one buffered or fetched record on its own; ``None`` if nothing was."""
        self._put_back_unsettled()
        if not (yield from self._housekeeping()):
            return None
        if not self.buffer:
            wait = self.options.poll_timeout if timeout is None else timeout
            self.buffer.extend((yield Poll(wait, self.options.max_records)))
            if self.acks is not None:
                self.acks.failing = False  # a poll came: publishes may be tried again
        if not self.buffer:
            return None
        record = self.buffer.popleft()
        tp = (record.topic, record.partition)
        accepted = tp in self.assigned and self.gate.accept(tp, record.offset, record=record)
        if accepted:
            self.unsettled = {_where(record): record}
        if self.acks is not None:
            yield from self._gone_acks()
        if not accepted:
            return None
        env = Envelope.from_record(record)
        self.inflight, self.revoked = {tp}, set()
        began = self.clock()
        try:
            outcome = yield from self.core.deliver(env, self._revoked, self._dead_letter)
            self.failures.pop((*tp, env.offset), None)
            self.outage_log.answered()
        except Exception as exc:
            outcome = yield from self._unexpected(env, exc)
        finally:
            self.inflight = set()
        yield from self._observed(env, outcome, began)
        self.unsettled = {}
        return outcome

    def _count_rerun(self, reason: str, count: int) -> None:
        if count and self.options.metrics is not None:
            self.options.metrics.batch_rerun(self.core.settings.consumer, reason, count)

    def _observe(self, outcome: Outcome, began: float) -> None:
        if self.options.metrics is not None:
            consumer = self.core.settings.consumer
            self.options.metrics.observe(consumer, outcome, self.clock() - began)

    def _observed(self, env: Envelope, outcome: Outcome, began: float) -> Plan[None]:
        self._observe(outcome, began)
        yield from settle(self, env, outcome)

    def close(self) -> Plan[None]:
        """Commit what is settled, then close the consumer and the sender: both, whatever
        failed before (the first error is raised after them)."""
        errors: list[Exception] = []
        if self.acks is not None and self.subscribed:
            yield from self._gone_acks()  # logs what fails: nothing would publish them later
        if self.pending is not None and self.subscribed:
            try:
                yield from commit(self.pending.take())
            except Exception as exc:  # not a PublishError (those are logged): a broken client
                errors.append(exc)
        for step in (CloseConsumer(), CloseSender()):
            try:
                yield step
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    # -- pieces -----------------------------------------------------------------------------------
    def _gone_acks(self) -> Plan[None]:
        """Acknowledgements held for records found gone: published before anything behind
        them is committed (:meth:`~outboxkit.inbox.gate.PartitionGate.take_gone_acks`)."""
        gone = self.gate.take_gone_acks()
        if gone and self.acks is not None:
            for g in gone:
                self.acks.drop((*g.partition, g.offset))
            yield from end_gone(gone, self.core.statements, self.options.acks_topic)

    def _unexpected(self, env: Envelope, exc: Exception) -> Plan[Outcome]:
        """Retry after an error outside the handler; give the record up after too many."""
        detail = self.core.settings.error_detail
        text = error_text(exc, detail=detail)
        where = (env.topic, env.partition, env.offset)
        # Handlers' errors never come here (settled as their runs' failures): every statement
        # failing here is the middleware's own, so a refused privilege is a grant to restore.
        away = not_the_records(exc)  # of a kind by its short text: no values, no SQL
        kind = ("processing", normalised(error_text(exc))) if away else None
        line = "processing %s/%d/%d failed: %s"
        self._say(logging.ERROR, kind, line, *where, text + grant_hint(exc), exc_info=detail)
        if away:
            count = 0  # the database's state or grants: never the record's, never given up
        else:
            count = self.failures[where] = self.failures.get(where, 0) + 1
        if count >= self.options.max_unexpected_errors:
            try:
                outcome = yield from self.core.give_up(env, text, count)
                self.failures.pop(where, None)
                return outcome
            except Exception as again:
                failed = error_text(again, detail=detail)
                logger.error("giving %s/%d/%d up failed too: %s", *where, failed)
        return Outcome(OutcomeKind.RETRY, None, retry_in=ERROR_RETRY_SECONDS)

    def _revoked(self) -> bool:
        return bool(self.revoked)

    def _say(
        self, level: int, kind: tuple[str, str] | None, msg: str, *args: Any, **kw: Any
    ) -> None:
        """Log a line; a ``kind`` (the database away: retried each second) is rate-limited."""
        if kind is None:
            logger.log(level, msg, *args, stacklevel=2, **kw)
        else:
            self.outage_log.log(level, kind, msg, *args, stacklevel=2, **kw)

    def _dead_letter(
        self, env: Envelope, event_id: str, error: str, attempts: int
    ) -> Publish | None:
        options, consumer = self.options, self.core.settings.consumer
        if options.dead_letter is None:
            return None
        ours = {"consumer": consumer, "event_id": event_id, "error": error, "attempts": attempts}
        return dead_letter_record(options.dead_letter, env, options.dead_letter_max_bytes, **ours)


def _where(record: ConsumedRecord) -> tuple[str, int, int]:
    return (record.topic, record.partition, record.offset)
