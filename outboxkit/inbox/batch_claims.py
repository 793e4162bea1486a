"""The claims of a batch (sans-IO): taken in one statement, given back when not run.

A claim given back (``release_batch``) takes its attempt back, so a record claimed in a batch
but not run, or run in a batch that then failed as a whole, is not counted as attempted: the
loop delivers it again (one by one after a failed batch) as a first attempt, not as a takeover
of an earlier run (which with ``max_attempts=1`` would end it dead without its handler having
run). Each claim is given back at most once; the give-back also gives the row a token nobody
holds, so one made again (owed after a lost reply) matches nothing.

A run the database interrupts is given back too, but only :data:`FREE_INTERRUPTIONS` times in a
row for one event (:class:`Interruptions`): a run that is interrupted every time (a watchdog, a
pooler's ``query_timeout`` ending each run of that event) then counts like a handler failure, so
it retries under the policy and ends ``dead`` instead of holding its partition for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from outboxkit.inbox.envelope import Envelope, Identity
from outboxkit.inbox.guard import error_text
from outboxkit.inbox.steps import (
    CallHandler,
    ClaimsHeld,
    CloseHandler,
    Plan,
    RunInTransaction,
    Step,
)
from outboxkit.inbox.store import Claim, InboxStatements

logger = logging.getLogger("outboxkit.inbox.batch")


# At most this many owed give-backs are kept; past it the oldest are forgotten (counted, as
# before): an event whose partition went to another member may never come back here.
OWED_MAX = 10_000
# Runs of one event the database may interrupt in a row before its interruptions count.
FREE_INTERRUPTIONS = 5


@dataclass(eq=False, slots=True)
class Interruptions:
    """How many times in a row each event's run was interrupted (at most :data:`OWED_MAX`
    events kept, the oldest forgotten: counted from zero again, which only delays the count)."""

    counts: dict[str, int] = field(default_factory=dict)

    def free(self, event_id: str) -> tuple[bool, int]:
        """One more interruption of ``event_id``'s run -> whether it is still no attempt, and
        how many in a row it makes."""
        count = self.counts.pop(event_id, 0) + 1
        self.counts[event_id] = count
        while len(self.counts) > OWED_MAX:
            del self.counts[next(iter(self.counts))]
        return count <= FREE_INTERRUPTIONS, count

    def ended(self, event_id: str) -> None:
        """The run ended some other way: the next interruption is the first again."""
        if self.counts:
            self.counts.pop(event_id, None)

    def outage(self) -> None:
        """A claim failed: the database itself is in trouble (a restart loop interrupting
        runs between restarts, say), which no record is to blame for: every count starts over."""
        self.counts.clear()


@dataclass(eq=False, slots=True)
class OwedClaims:
    """Claims whose give-back failed, ``event_id -> token``, given back before a new claim."""

    statements: InboxStatements
    claims: dict[str, int] = field(default_factory=dict)

    def owe(self, keys: Iterable[tuple[str, int]]) -> None:
        self.claims.update(keys)
        while len(self.claims) > OWED_MAX:
            del self.claims[next(iter(self.claims))]

    def repay(self, event_ids: Iterable[str]) -> Plan[None]:
        """Give back what is owed for these events; raises while the database is still away
        (the loop retries, never counted). By token: a claim taken over meanwhile is kept."""
        keys = [(e, self.claims[e]) for e in event_ids if e in self.claims]
        if keys:
            yield self.statements.release_batch(keys)
            for event_id, _ in keys:
                self.claims.pop(event_id, None)


@dataclass(eq=False, slots=True)
class BatchClaims:
    statements: InboxStatements
    owed: OwedClaims | None = None  # where a failed give-back is left
    interruptions: Interruptions | None = None  # told when the claim fails
    held: dict[str, Claim] = field(default_factory=dict)  # by event id, as claimed
    released: set[str] = field(default_factory=set)  # event ids given back already
    kept: set[str] = field(default_factory=set)  # event ids whose run counts (see keep)

    def take(self, items: list[tuple[Identity, Envelope]]) -> Plan[dict[str, Claim]]:
        """Claim the records in one statement -> the claims made, by event id (the others are
        duplicates or reused ids)."""
        try:
            rows = (yield self.statements.claim_batch(items)).rows
        except Exception:
            if self.interruptions is not None:
                self.interruptions.outage()
            raise
        self.held = {row[0]: Claim.claimed(*row[1:4]) for row in rows}
        if self.held:
            yield ClaimsHeld(self)
        return self.held

    def at_stop(self, in_flight: Step | None) -> Plan[None]:
        """A stop (``KeyboardInterrupt``, ``SystemExit``, a task's cancellation) ended the batch
        (``in_flight``: the step it came in): give back the claims whose runs do not count. The
        handlers' transaction is rolled back, so none of its runs counts but the one the stop
        came in (a handler that stops the process at every run must end ``dead``, not loop).
        Rows another transaction holds are skipped: a stop must not wait. The give-back is owed
        until it is made (a failure is logged, never raised over the stop)."""
        skip = self.released | self.kept | _running(in_flight)
        keys = [(e, claim.token) for e, claim in self.held.items() if e not in skip]
        if not keys:
            return
        if self.owed is not None:  # owed until made: a second stop may cut the statement short
            self.owed.owe(keys)
        try:
            done = yield self.statements.release_stopped_batch(keys)
        except Exception as exc:
            logger.warning("claims of a stopped batch not given back: %s", error_text(exc))
            return
        if self.owed is not None:
            for event_id, _ in keys:
                self.owed.claims.pop(event_id, None)
        if done.rowcount < len(keys):
            logger.info(
                "stopped batch: %d of %d claims held by another transaction stay counted",
                len(keys) - done.rowcount,
                len(keys),
            )

    def release(self, keys: list[tuple[str, int]]) -> Plan[None]:
        """Give claims back, ``(event_id, token)`` each."""
        if keys:
            yield self.statements.release_batch(keys)
            self.released.update(event_id for event_id, _ in keys)

    @contextmanager
    def committing(self, event_ids: Iterable[str]) -> Iterator[None]:
        """Around the commit of the handlers' transaction: the runs of ``event_ids`` (failed
        or lost in it) count once the commit is sent, even if a stop comes in it; not if it
        raises (the batch then fails as a whole: nothing of it counts)."""
        ended = set(event_ids) - self.kept
        self.kept |= ended
        try:
            yield
        except Exception:
            self.kept -= ended
            raise

    def keep(self, event_ids: Iterable[str]) -> None:
        """These runs count, whatever fails later: a record run alone (one delivery), and once
        the handlers' transaction committed, a handler that failed or lost its lease. Given
        back, it would run again for free (with ``max_attempts=1``, a second dead letter)."""
        self.kept.update(event_ids)

    def give_back(self, unsettled: Iterable[str]) -> Plan[None]:
        """The batch failed as a whole: give back the claims of ``unsettled`` (event ids with no
        outcome recorded) not given back yet. Never raises: the batch's error is the one to
        report, and the loop delivers the records again either way."""
        skip = self.released | self.kept
        keys = [
            (event_id, self.held[event_id].token)
            for event_id in unsettled
            if event_id in self.held and event_id not in skip
        ]
        try:
            # Roll back first: a mark that failed part-way holds row locks the give-back needs.
            yield CloseHandler()
            yield from self.release(keys)
        except Exception as exc:
            logger.warning("claims of a failed batch not given back: %s", error_text(exc))
            if self.owed is not None:
                self.owed.owe(keys)


def _running(step: Step | None) -> set[str]:
    """The event ids whose handler ``step`` runs (a batch handler's call: all of its events)."""
    if isinstance(step, RunInTransaction):
        return {ctx.event_id for ctx in step.contexts}
    if isinstance(step, CallHandler):
        return {step.ctx.event_id}
    return set()
