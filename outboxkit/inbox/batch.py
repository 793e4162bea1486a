"""Batched exactly-once processing (sans-IO): several deliveries, one claim, one transaction.

:func:`deliver_batch` takes the records the loop fetched, in fetch order, and:

1. identifies each (no usable id -> rejection log, as for one delivery); a second record with
   an id already in the batch ends the batch there (it comes again in the next one);
2. **claims** them all in one short statement (same rules as one claim, row by row);
3. a record whose claim is a takeover (an earlier run did not finish: a retry, a crash, a
   rebalance) runs **alone**, in its own transaction, as one delivery does; the batch ends
   before it. So a record that crashes the process is retried and given up on its own, and a
   crash costs the records of a batch one claim each, once;
4. opens **one transaction** and runs the handlers in it **optimistically**, without
   savepoints (one round trip per handler statement). The first handler that fails (raises, its
   lease is lost, or it leaves the transaction aborted) ends that run: the transaction is rolled
   back, the failure is that handler's own (each earlier one left the transaction healthy), and
   the batch runs **again with a savepoint per handler**, the failed handler left out: a handler
   that fails then rolls back only its own writes. Records behind a failure in the same
   partition are not run (their claims are given back) and wait as without batching. The
   events of a batch handler run in one call; if it fails, they run again one by one
   (:mod:`outboxkit.inbox.batch_handler`);
5. marks the successes ``succeeded`` in one statement, each conditional on its own token, and
   commits once. If a mark is refused (cancelled or fenced meanwhile) the transaction is rolled
   back and the other handlers run again in a new one, with savepoints (their writes still
   commit once);
6. then settles the failures (retry or dead, one by one) and the lost leases.

Both runs belong to the same claim, so a rolled-back optimistic run is not an attempt. A batch
that fails as a whole gives back every claim it did not settle, and so does a stop, but for the
handler running then (:mod:`.batch_claims`). The loop commits the offsets after that. Outcomes
are returned only for records no earlier record of the same partition holds back; the records
to deliver again are handed back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from outboxkit.errors import BatchTransactionEndedError, DecodeError, LeaseLostError
from outboxkit.faults import fault_point
from outboxkit.inbox.batch_claims import BatchClaims
from outboxkit.inbox.batch_handler import bulk_call, rounds
from outboxkit.inbox.context import HandlerContext
from outboxkit.inbox.delivery import (
    REFUSED_BY_TOKEN,
    ClaimedRun,
    DeadLetterStep,
    InboxCore,
    handler_context,
)
from outboxkit.inbox.envelope import Envelope, Identity
from outboxkit.inbox.guard import message
from outboxkit.inbox.outcome import Outcome, OutcomeKind
from outboxkit.inbox.steps import (
    CloseHandler,
    CommitHandler,
    EndDelivery,
    OpenHandler,
    Plan,
    RunInSavepoint,
    RunInTransaction,
    StartLeases,
)
from outboxkit.inbox.store import Claim

TopicPartition = tuple[str, int]
RevokedPartition = Callable[[TopicPartition], bool]


@dataclass(frozen=True)
class BatchResult:
    """Outcomes in record order, and the records to deliver again (their indexes, in order)."""

    outcomes: list[tuple[Envelope, Outcome]]
    rest: list[int]
    reruns: int = 0  # times the handlers ran again in a new transaction (for a metric)


@dataclass(eq=False, slots=True)
class _Item:
    index: int
    run: ClaimedRun
    tp: TopicPartition
    key: tuple[str, int]  # (event_id, token)
    event: Any = None
    handler: Callable[..., Any] | None = None
    bulk: Callable[..., Any] | None = None  # its batch handler, if its type has one
    ctx: HandlerContext | None = None


@dataclass
class _Batch:
    core: InboxCore
    revoked: RevokedPartition
    dead_letter: DeadLetterStep
    done: dict[int, Outcome] = field(default_factory=dict)
    # the first index of each partition that holds the records behind it back
    held: dict[TopicPartition, int] = field(default_factory=dict)
    failed: list[tuple[_Item, Exception]] = field(default_factory=list)
    lost: list[tuple[_Item, str]] = field(default_factory=list)
    unrun: list[_Item] = field(default_factory=list)
    # indexes of the items whose batch handler's call failed: from now on called one by one
    singles: set[int] = field(default_factory=set)
    transactions: int = 0  # opened for the handlers: all but the last rolled back
    claims: BatchClaims = field(init=False)

    def __post_init__(self) -> None:
        self.claims = BatchClaims(self.core.statements, self.core.owed, self.core.interruptions)

    def ended_ids(self) -> list[str]:  # failed or lost: their runs count once committed
        return [item.run.ident.event_id for item, _ in (*self.failed, *self.lost)]

    def holds(self, item: _Item) -> bool:
        first = self.held.get(item.tp)
        return first is not None and first < item.index

    def hold(self, item: _Item) -> None:
        self.held[item.tp] = min(item.index, self.held.get(item.tp, item.index))

    def deliver(self, envs: list[Envelope]) -> Plan[BatchResult]:
        picked, stop = yield from self._admit(envs)
        if not picked:
            return self._result(envs, stop)
        yield from self.core.owed.repay(p.ident.event_id for p in picked)
        claims = yield from self.claims.take([(p.ident, p.env) for p in picked])
        try:
            stop = yield from self._claimed(picked, claims, stop)
        except Exception:
            # Delivered one by one next: a claim whose run does not count (no handler call, or
            # one rolled back) is given back, or it would come back as a takeover with an
            # attempt spent (the runs that count were kept: see BatchClaims.keep).
            done = self.done
            yield from self.claims.give_back(
                p.ident.event_id for p in picked if p.index not in done
            )
            raise
        return self._result(envs, stop)

    def _claimed(self, picked: list[_Picked], claims: dict[str, Claim], stop: int) -> Plan[int]:
        """Run and settle what was claimed -> where the batch stops (see :meth:`_result`)."""
        takeover = next((n for n, p in enumerate(picked) if _taken(claims, p.ident)), None)
        if takeover is not None:
            later = picked[takeover + 1 :] if takeover == 0 else picked[takeover:]
            gone = [p.ident.event_id for p in later if p.ident.event_id in claims]
            yield from self.claims.release([(e, claims[e].token) for e in gone])
            stop = later[0].index if later else stop
            if takeover == 0:  # it runs alone, in a transaction of its own
                head = picked[0]
                run = ClaimedRun(
                    head.env, head.ident, claims[head.ident.event_id], self.dead_letter
                )
                revoked = self._revoked_for(head.env)
                self.claims.keep([head.ident.event_id])  # run alone: one delivery's attempt
                self.done[head.index] = yield from self.core.run_claimed(run, revoked)
            picked = picked[:takeover]
        items = []
        for p in picked:
            claim = claims.get(p.ident.event_id)
            if claim is None:
                yield from self._not_claimed(p)
            else:
                items.append(self._item(p, claim))
        items = yield from self._prepare(items)
        succeeded = yield from self._transaction(items)
        self.claims.keep(self.ended_ids())
        for item in succeeded:
            self.done[item.index] = Outcome.succeeded(
                item.run.ident.event_id, item.run.claim.attempts
            )
        # Given back before the failures are settled (a dead letter may wait on Kafka).
        yield from self.claims.release([item.key for item in self.unrun])
        for item, exc in self.failed:
            self.done[item.index] = yield from self.core.failed(item.run, exc)
        for item, reason in self.lost:
            self.done[item.index] = yield from self.core.lease_lost(item.run, reason)
        return stop

    # -- phases -----------------------------------------------------------------------------------
    def _admit(self, envs: list[Envelope]) -> Plan[tuple[list[_Picked], int]]:
        """Identify each record; stop at an event id seen earlier in the batch."""
        picked: list[_Picked] = []
        seen: set[str] = set()
        core, too_old = self.core, self.core.settings.too_old
        for index, env in enumerate(envs):
            found = core.identify(env)  # a plan of its own only for a refusal or an old replay
            if isinstance(found, Identity) and not too_old(env):
                ident: Identity | Outcome = found
            else:
                ident = yield from core.admitted(env, found)
            if isinstance(ident, Outcome):
                self.done[index] = ident
                continue
            if ident.event_id in seen:
                return picked, index
            seen.add(ident.event_id)
            picked.append(_Picked(index, ident, env))
        return picked, len(envs)

    def _not_claimed(self, p: _Picked) -> Plan[None]:
        claim = yield from self.core.statements.unclaimed_plan(p.ident)
        if claim is None:  # purged between the claim and the look-up: deliver it again
            self.done[p.index] = Outcome(OutcomeKind.RETRY, p.ident.event_id)
            return
        self.done[p.index] = yield from self.core.not_claimed(p.env, p.ident, claim)

    def _item(self, p: _Picked, claim: Claim) -> _Item:
        run = ClaimedRun(p.env, p.ident, claim, self.dead_letter)
        return _Item(p.index, run, (p.env.topic, p.env.partition), (p.ident.event_id, claim.token))

    def _prepare(self, items: list[_Item]) -> Plan[list[_Item]]:
        """Decode each event and find its handler (refused ones end ``rejected``); take leases."""
        settings, runnable = self.core.settings, []
        registry, fallback = settings.registry, self.core.handler
        handlers: dict[str | None, tuple[Any, Any]] = {}  # per event type: one look-up a batch
        for item in items:
            ident = item.run.ident
            try:
                item.event = registry.decode(
                    ident.event_type, ident.content_type, item.run.env.value
                )
            except DecodeError as exc:
                self.done[item.index] = yield from self.core.refuse(item.run, str(exc))
                continue
            if (found := handlers.get(ident.event_type)) is None:
                found = handlers[ident.event_type] = (
                    registry.handler_for(ident.event_type) or fallback,
                    registry.batch_handler_for(ident.event_type),
                )
            item.handler, item.bulk = found
            if item.handler is None:
                reason = f"no handler for {ident.event_type!r}"
                self.done[item.index] = yield from self.core.refuse(item.run, reason)
                continue
            runnable.append(item)
        if not runnable:
            return runnable
        leases = yield StartLeases(tuple(item.key for item in runnable))
        revoked: dict[TopicPartition, Callable[[], bool]] = {}
        for item, lease in zip(runnable, leases, strict=True):
            run = item.run
            if item.tp not in revoked:
                revoked[item.tp] = self._revoked_for(run.env)
            ctx = handler_context(settings, run.env, run.ident, run.claim, lease, revoked[item.tp])
            item.ctx = ctx
        return runnable

    def _transaction(self, items: list[_Item]) -> Plan[list[_Item]]:
        """Run the handlers in one transaction, first without savepoints; mark and commit the
        successes. After any rollback the rest runs again, each handler in a savepoint."""
        savepoints = False
        while items:
            yield OpenHandler()
            self.transactions += 1
            ran, broken = yield from self._run_handlers(items, savepoints)
            if broken:  # a handler failed in the optimistic run: the others run again
                yield CloseHandler()
                ended = {i for i, _ in self.failed} | {i for i, _ in self.lost}
                items, savepoints = [i for i in items if i not in ended], True
                continue
            if not ran:
                yield CloseHandler()
                return []
            try:
                marked = yield self.core.statements.succeeded_batch([item.key for item in ran])
            except Exception:
                if savepoints:
                    raise
                # A broken transaction no handler was found to have left behind: run every
                # handler again in a savepoint, where a failing one is found and left out.
                yield CloseHandler()
                savepoints = True
                continue
            ids = {row[0] for row in marked.rows}
            if len(ids) == len(ran):
                fault_point("before_db_commit")
                with self.claims.committing(self.ended_ids()):
                    yield CommitHandler()
                fault_point("after_db_commit")
                return ran
            # Cancelled or fenced meanwhile: its writes must not commit, so none of this
            # transaction's may; the others run again in a new one.
            yield CloseHandler()
            items, savepoints = [], True
            for item in ran:
                if item.run.ident.event_id in ids:
                    items.append(item)
                else:
                    self.lost.append((item, REFUSED_BY_TOKEN))
                    self.hold(item)
        return []

    def _run_handlers(self, items: list[_Item], savepoints: bool) -> Plan[tuple[list[_Item], bool]]:
        """The handlers that ran, in fetch order per partition (a batch handler's group in one
        call, one by one once that failed), and whether the run broke off: without savepoints
        it stops at the first failure (recorded, or the failed group marked to run one by one),
        and what the others wrote is lost with it."""
        run = RunInSavepoint if savepoints else RunInTransaction
        ran: list[_Item] = []
        bulk = any(item.bulk is not None for item in items)
        plain = ([i] for i in items)
        groups = rounds(items, lambda i: i.tp, self._bulk_of, self.holds) if bulk else plain
        for group in groups:
            if len(group) > 1:
                fn, contexts = group[0].bulk, [i.ctx for i in group if i.ctx is not None]
                assert fn is not None
                if any(ctx.lease_lost for ctx in contexts):  # known lost: one by one at once
                    self.singles.update(i.index for i in group)
                elif (yield from bulk_call(run, fn, [i.event for i in group], contexts)):
                    ran.extend(group)
                    continue
                else:
                    self.singles.update(i.index for i in group)
                    if not savepoints:
                        return ran, True
            for item in group:
                if self.holds(item):
                    self.unrun.append(item)
                elif (yield from self._run_one(run, item)):
                    ran.append(item)
                elif not savepoints:
                    return ran, True
        return ran, False

    def _run_one(self, run: type[RunInTransaction], item: _Item) -> Plan[bool]:
        """The item's handler; whether it ran. An item of a batch handler's group that runs one
        by one is not called if its lease is lost already."""
        assert item.handler is not None
        assert item.ctx is not None
        try:
            if item.index in self.singles:
                item.ctx.check()
            yield run(item.handler, (item.event, item.ctx), (item.ctx,))
        except LeaseLostError as exc:
            self.lost.append((item, message(exc)))
        except BatchTransactionEndedError:
            raise  # the batch's earlier writes are gone: the loop delivers it one by one
        except Exception as exc:
            # Retried, or dead-lettered after the commit: either way the records behind it
            # run after it ended, as without batching.
            self.failed.append((item, exc))
        else:
            return True
        self.hold(item)
        return False

    def _bulk_of(self, item: _Item) -> Callable[..., Any] | None:
        return None if item.index in self.singles else item.bulk

    def _revoked_for(self, env: Envelope) -> Callable[[], bool]:
        tp = (env.topic, env.partition)
        return lambda: self.revoked(tp)

    def _result(self, envs: list[Envelope], stop: int) -> BatchResult:
        """Outcomes in record order, except behind a record that stays unsettled in its
        partition: behind a retry or a lost lease nothing (the loop seeks back to it); behind
        a record not run (held back, or after ``stop``) everything is delivered again."""
        outcomes: list[tuple[Envelope, Outcome]] = []
        rest: list[int] = []
        blocked: set[TopicPartition] = set()
        deferred: set[TopicPartition] = set()
        for index, env in enumerate(envs):
            tp = (env.topic, env.partition)
            if tp in blocked:
                continue
            outcome = self.done.get(index) if index < stop else None
            if outcome is None or tp in deferred:
                deferred.add(tp)
                rest.append(index)
                continue
            outcomes.append((env, outcome))
            if not outcome.kind.advances_offset:
                blocked.add(tp)
        return BatchResult(outcomes, rest, max(self.transactions - 1, 0))


@dataclass(frozen=True, slots=True)
class _Picked:
    index: int
    ident: Identity
    env: Envelope


def _taken(claims: dict[str, Claim], ident: Identity) -> bool:
    claim = claims.get(ident.event_id)
    return claim is not None and claim.attempts > 1


def deliver_batch(
    core: InboxCore, envs: list[Envelope], revoked: RevokedPartition, dead_letter: DeadLetterStep
) -> Plan[BatchResult]:
    """Process ``envs`` as one batch (see the module docs); ends by releasing leases, session."""
    try:
        result = yield from _Batch(core, revoked, dead_letter).deliver(envs)
    except Exception:
        yield EndDelivery()
        raise
    yield EndDelivery()
    return result
