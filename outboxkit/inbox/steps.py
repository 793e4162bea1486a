"""The inbox's sans-IO seam: plans yield steps, drivers execute them.

A *plan* is a generator: plain code that decides what happens to a delivery, a consumer loop or
a lease, yields one :class:`Step` at a time, and receives the step's result back (or the step's
exception, thrown in at the ``yield``). An *executor* maps each step type to the call that
performs it. The sync and async paths differ only there, and in :func:`drive_sync` vs
:func:`drive_async`: an async executor returns awaitables, which :func:`drive_async` awaits.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import types
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from outboxkit.db import Query
from outboxkit.errors import HandlerCancelledError
from outboxkit.inbox.guard import error_text
from outboxkit.kafka.api import Headers, TopicPartition

logger = logging.getLogger("outboxkit.inbox.consumer")

T = TypeVar("T")
Plan = Generator["Step", Any, T]


class Step:
    """Base of every step (the executor dispatches on the exact type)."""

    __slots__ = ()


# -- database -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Sql(Step):
    """Run one statement on a connection of its own (autocommit) -> ``db.Result``."""

    query: Query
    params: Mapping[str, Any]
    binary: bool = False  # binary parameters: arrays (of bytes above all) bind far cheaper


@dataclass(frozen=True, slots=True)
class HandlerSql(Sql):
    """Run one statement in the open handler transaction instead -> ``db.Result``."""


# -- the handler's transaction -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CallHandler(Step):
    """Open the handler's session (commits refused) and call ``handler(event, ctx, session)``."""

    handler: Callable[..., Any]
    event: Any
    ctx: Any


class OpenHandler(Step):
    """Open the handler's session (commits refused) and begin its transaction, for a batch of
    :class:`RunInTransaction` or :class:`RunInSavepoint`."""


@dataclass(frozen=True, slots=True)
class RunInTransaction(Step):
    """In the open handler session, with no savepoint: ``handler(*args, session)``, every
    context's ``check()``, a flush. Raises ``HandlerTransactionAbortedError`` if the handler left
    the transaction aborted. After any error only a rollback of the whole transaction is left."""

    handler: Callable[..., Any]
    args: tuple[Any, ...]
    contexts: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class RunInSavepoint(RunInTransaction):
    """:class:`RunInTransaction` in a savepoint of its own: released if all went well, else
    rolled back to (the error raised), so the transaction goes on without this handler's writes."""


class StopGiveBack(Protocol):
    """A batch's claims, as the driver sees them at a stop (see :class:`ClaimsHeld`)."""

    def at_stop(self, in_flight: Step | None) -> Plan[None]:
        """Give back the claims whose runs do not count; raises no ``Exception``."""


@dataclass(frozen=True, slots=True)
class ClaimsHeld(Step):
    """The claims a batch holds, until its :class:`EndDelivery`. If a stop (a ``BaseException``:
    ``KeyboardInterrupt``, ``SystemExit``, the task's cancellation) ends the plan, the driver
    runs the plan ``claims.at_stop(in_flight)`` (``in_flight``: the step running then, if
    any), so the records whose runs do not count are not charged an attempt."""

    claims: StopGiveBack


class CommitHandler(Step):
    """Commit the handler's transaction (with the ``succeeded`` mark in it) and close it."""


class CloseHandler(Step):
    """Roll the handler's transaction back, if one is open, and close it."""


# -- lease and delivery --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StartLease(Step):
    """Keep ``(event_id, token)`` renewed until :class:`EndDelivery` -> a ``LeaseHandle``."""

    event_id: str
    token: int


@dataclass(frozen=True, slots=True)
class StartLeases(Step):
    """:class:`StartLease` for each ``(event_id, token)`` of a batch, in one step -> a list of
    ``LeaseHandle`` (one driver call per batch instead of one per event)."""

    claims: tuple[tuple[str, int], ...]


class EndDelivery(Step):
    """Stop renewing the lease and close any open handler transaction."""


@dataclass(frozen=True, slots=True)
class Sleep(Step):
    """Wait (the lease keeper between renewals); a closing driver may cut it short. The reply,
    where a stop event cuts it short (the consumer's): whether it did (a wait that would go on
    asking, as the start-up topic check, ends then)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Call(Step):
    """Call an application callback (e.g. a dead-letter sink); its result is the reply."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]


# -- Kafka (executed by `outboxkit.inbox.kafka_steps` over the client seam) ------------------------
@dataclass(frozen=True, slots=True)
class Subscribe(Step):
    """Join the group; the callbacks run on every rebalance."""

    topics: list[str]
    on_assign: Callable[[list[TopicPartition]], None]
    on_revoke: Callable[[list[TopicPartition]], Mapping[TopicPartition, int]]


@dataclass(frozen=True, slots=True)
class Seek(Step):
    """Fetch the partition from ``offset`` next -> whether it will (``False`` if it is not
    assigned any more, or the client refused)."""

    partition: TopicPartition
    offset: int


@dataclass(frozen=True, slots=True)
class Poll(Step):
    """Fetched records -> ``list[ConsumedRecord]`` (rebalance callbacks may run meanwhile)."""

    timeout: float
    max_records: int


@dataclass(frozen=True, slots=True)
class Commit(Step):
    """Commit the next offsets to read, synchronously (``PublishError`` if it fails)."""

    offsets: Mapping[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class Committed(Step):
    """The group's committed offsets of these partitions -> ``dict[TopicPartition, int]``
    (none committed: left out); ``PublishError`` if not read within ``timeout`` seconds."""

    partitions: list[TopicPartition]
    timeout: float


@dataclass(frozen=True, slots=True)
class LogBounds(Step):
    """The partition's log start and end offsets, read from the broker -> ``(start, end)``;
    ``PublishError`` if not read within ``timeout`` seconds."""

    partition: TopicPartition
    timeout: float


@dataclass(frozen=True, slots=True)
class Pause(Step):
    """Stop fetching these partitions (those not assigned any more are ignored)."""

    partitions: list[TopicPartition]


class Resume(Pause):
    """Fetch these partitions again."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Publish(Step):
    """Produce one record and wait for the broker's acknowledgement (dead letters, acks)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers


@dataclass(frozen=True, slots=True)
class TopicExists(Step):
    """Whether the cluster knows ``topic`` -> ``bool``."""

    topic: str


class CloseConsumer(Step):
    """Commit nothing more; leave the group."""


class CloseSender(Step):
    """Flush and close the dead-letter/acks producer."""


# -- driving ------------------------------------------------------------------------------------
class Executor(Protocol):
    """Performs steps. Sync executors return values; async ones may return awaitables."""

    def __call__(self, step: Step) -> Any: ...

    def release(self, in_flight: Step | None) -> Any:
        """Free what an unfinished plan left open, and give a stopped batch's claims back (a
        BaseException ended the plan; ``in_flight``: the step it came in, if any)."""


StepTable = Mapping[type[Step], Callable[[Any], Any]]


class TableExecutor:
    """An executor that looks the step's type up in a table of callables."""

    def __init__(self, table: StepTable) -> None:
        self.table = dict(table)

    def __call__(self, step: Step) -> Any:
        return self.table[type(step)](step)

    def release(self, in_flight: Step | None) -> Any:
        return None


def handler_cancelled(
    step: Step, exc: asyncio.CancelledError, cancelling: int
) -> HandlerCancelledError | None:
    """A ``CancelledError`` out of ``step`` as its handler's failure, or ``None`` (it ends the
    drive). ``cancelling``: the driver's own task's pending cancellations (``Task.cancelling()``;
    0 for the sync driver, which has no task to cancel).

    Only a cancellation of the consumer itself stops it. A handler's own one (a child task it
    awaited was cancelled, or an ``asyncio.run()`` in a sync handler) would otherwise end the
    process, and every restart would run the same event into it until its attempts ran out.
    """
    if cancelling or not isinstance(step, CallHandler | RunInTransaction):
        return None
    raised = error_text(exc).rstrip(": ")
    failure = HandlerCancelledError(f"the handler raised {raised}; the consumer was not cancelled")
    failure.__cause__ = exc
    return failure


def _no_task() -> int:
    return 0


def _task_cancelling() -> int:
    """The running task's pending cancellations; with no task (not asyncio's loop) nothing
    tells a handler's cancellation from the consumer's: counted as the consumer's, as before."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop running
        return 1
    return 1 if task is None else task.cancelling()


@types.coroutine
def _drive(
    plan: Plan[T], execute: Executor, cancelling: Callable[[], int]
) -> Generator[Any, Any, T]:
    """Feed each step's result (or exception) back into ``plan`` until it returns.

    A generator-based coroutine: awaitables returned by an async executor are awaited with
    ``yield from``, so the same loop serves :func:`drive_sync` (which never sees one) and
    :func:`drive_async`. Only ``Exception`` goes back into the plan, and a handler's own
    ``CancelledError`` as a :class:`HandlerCancelledError` (:func:`handler_cancelled`); any
    other ``BaseException`` (cancellation, interrupt) ends the drive after ``release``, told
    the step it came in (``None``: it came in the plan's own code, between steps). A
    cancellation of the consumer's task that a step swallowed (a handler's ``except
    CancelledError: pass``, or one raising its own error instead) is raised once the step
    ends: otherwise nothing would stop it.
    """
    reply: Any = None
    error: Exception | None = None
    in_flight: Step | None = None  # the step being executed: a stop may come in it
    try:
        while True:
            try:
                step = plan.send(reply) if error is None else plan.throw(error)
            except StopIteration as done:
                result: T = done.value
                return result
            in_flight, pending = step, cancelling()
            try:
                reply, error = execute(step), None
                # Per step, so the common replies skip ``isawaitable`` (an ABC check): none (most
                # sync steps) and a coroutine (every async step), awaited directly.
                if reply is None:
                    pass
                elif type(reply) is types.CoroutineType:
                    reply = yield from reply.__await__()
                elif inspect.isawaitable(reply):
                    reply = yield from _await(reply)
                if cancelling() > pending:  # this task was cancelled and a handler swallowed it
                    raise asyncio.CancelledError
            except Exception as exc:
                if cancelling() > pending:  # ... or made it an error of its own: still a stop
                    _taken_as_the_stop(exc)
                    raise asyncio.CancelledError from exc
                reply, error = None, exc
            except asyncio.CancelledError as exc:
                error = handler_cancelled(step, exc, cancelling())
                if error is None:
                    raise
                reply = None
            in_flight = None
    except GeneratorExit:  # closed unfinished: nothing can be awaited any more
        released = execute.release(in_flight)
        if inspect.iscoroutine(released):
            released.close()
        raise
    except BaseException:
        released = execute.release(in_flight)
        if inspect.isawaitable(released):
            yield from _await(released)
        raise


def _taken_as_the_stop(exc: Exception) -> None:
    """Said, as the stop's cause is otherwise silent: a helper in the handler that cancels the
    task for a timeout of its own and does not undo it (``Task.uncancel``) lands here too."""
    logger.warning(
        "the consumer's task was cancelled during a step that then raised %s instead: taken as"
        " the stop (a timeout helper that cancels the task without uncancel() looks the same)",
        error_text(exc).rstrip(": "),
    )


def _await(awaitable: Awaitable[Any]) -> Generator[Any, Any, Any]:
    return (yield from awaitable.__await__())


def drive_sync(plan: Plan[T], execute: Executor) -> T:
    """Run ``plan`` with a sync executor."""
    runner = _drive(plan, execute, _no_task)
    try:
        runner.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    runner.close()
    raise TypeError("a sync executor returned an awaitable")


async def drive_async(plan: Plan[T], execute: Executor) -> T:
    """Run ``plan`` with an async executor (awaiting what its steps return)."""
    return await _drive(plan, execute, _task_cancelling)
