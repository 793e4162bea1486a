"""What the sync and async inbox executors share: the step table, the leases, and a stop.

A stop (``KeyboardInterrupt``, ``SystemExit``, the task's cancellation) ends a plan without
its own clean-up: the driver calls the executor's ``release``. A batch's claims are given back
then (:class:`~outboxkit.inbox.steps.ClaimsHeld`; which ones is the plan's decision): the
batch's transaction is rolled back, and a record that did not run must not be charged an
attempt, which with ``max_attempts=1`` ended it ``dead`` unrun at the next start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from outboxkit.inbox.lease import LeaseHandle, LeaseTask, LeaseThread
from outboxkit.inbox.steps import (
    Call,
    CallHandler,
    ClaimsHeld,
    CloseHandler,
    CommitHandler,
    EndDelivery,
    HandlerSql,
    OpenHandler,
    RunInSavepoint,
    RunInTransaction,
    Sql,
    StartLease,
    StartLeases,
    Step,
    StepTable,
)

logger = logging.getLogger("outboxkit.inbox.batch")
# How long the async driver gives the give-back of a stopped batch's claims (connecting
# included): a stop must end.
STOP_GIVE_BACK_SECONDS = 5.0

METHODS: dict[type[Step], str] = {
    HandlerSql: "handler_sql",
    CallHandler: "call_handler",
    CommitHandler: "commit_handler",
    CloseHandler: "close_handler",
    OpenHandler: "open_handler",
    RunInSavepoint: "run_in_savepoint",
    RunInTransaction: "run_in_transaction",
    StartLease: "start_lease",
    StartLeases: "start_leases",
    EndDelivery: "end_delivery",
}


def _call(step: Call) -> Any:
    return step.fn(*step.args)


def cut_short(exc: BaseException) -> None:
    """A second stop (a cancellation, a Ctrl-C) ended the give-back of a stopped batch."""
    logger.warning("claims of a stopped batch not given back (%s)", type(exc).__name__)


class StepsBase:
    """One driver's executor: the open handler session and the running lease live here.

    Subclasses provide the methods named in :data:`METHODS` (sync, or coroutines) and
    ``release``, which ends the delivery, then drives the give-back plan of the claims
    :meth:`stopped` finds, if any.
    """

    def __init__(
        self, keeper: LeaseThread | LeaseTask, sql: Callable[[Sql], Any], extra: StepTable
    ) -> None:
        self.keeper = keeper
        self.leases: list[LeaseHandle] = []
        self.driver: Any = None  # the open handler transaction's driver connection
        self.held: ClaimsHeld | None = None  # a batch's claims, until its EndDelivery
        self.table: dict[type[Step], Callable[[Any], Any]] = {
            kind: getattr(self, name) for kind, name in METHODS.items()
        }
        self.table.update({Sql: sql, Call: _call, ClaimsHeld: self.hold_claims, **extra})

    def __call__(self, step: Step) -> Any:
        return self.table[type(step)](step)

    def hold_claims(self, step: ClaimsHeld) -> None:
        self.held = step

    def stopped(self) -> ClaimsHeld | None:
        """At a stop: the batch's claims, if it holds any (taken off first, so that whatever
        fails next leaves nothing behind for a later plan)."""
        held, self.held = self.held, None
        return held

    def start_lease(self, step: StartLease) -> LeaseHandle:
        lease = self.keeper.begin(step.event_id, step.token)
        self.leases.append(lease)
        return lease

    def start_leases(self, step: StartLeases) -> list[LeaseHandle]:
        leases = self.keeper.begin_all(step.claims)
        self.leases.extend(leases)
        return leases

    def stop_lease(self) -> None:
        self.held = None  # the delivery ended: nothing of it is given back any more
        leases, self.leases = self.leases, []
        for lease in leases:
            self.keeper.schedule.end(lease)
