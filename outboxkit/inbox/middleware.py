"""The two thin drivers of :class:`~outboxkit.inbox.delivery.InboxCore`: sync and async.

:class:`Inbox` runs the core's steps with a SQLAlchemy ``Engine`` (the handler gets a
``Session``), :class:`AsyncInbox` with an ``AsyncEngine`` (the handler is a coroutine getting an
``AsyncSession``). Every statement goes through :mod:`outboxkit.db`: the inbox bookkeeping on an
autocommit connection of its own, the ``succeeded`` mark in the handler's transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic, TypeVar

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from outboxkit import db
from outboxkit.errors import BatchTransactionEndedError, ConfigurationError
from outboxkit.inbox.context import HandlerContext
from outboxkit.inbox.delivery import DeadLetterStep, InboxCore, InboxSettings, Revoked
from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.executor_base import STOP_GIVE_BACK_SECONDS, StepsBase, cut_short
from outboxkit.inbox.handler_session import (
    AUTOCOMMIT,
    allow_commit,
    awaited,
    committed,
    driver_of,
    handler_session,
    handler_session_async,
    instead_of_failure,
    isolated,
    isolated_async,
    pending,
    releasing,
    returned_nothing,
    still_on,
    transaction_aborted,
    transaction_ended,
)
from outboxkit.inbox.lease import LeaseSchedule as _Schedule
from outboxkit.inbox.lease import LeaseTask, LeaseThread
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.steps import (
    Call,
    CallHandler,
    CloseHandler,
    CommitHandler,
    EndDelivery,
    HandlerSql,
    OpenHandler,
    RunInSavepoint,
    RunInTransaction,
    Sql,
    Step,
    StepTable,
    drive_async,
    drive_sync,
)

SyncHandler = Callable[[Any, HandlerContext, Session], None]
AsyncHandler = Callable[[Any, HandlerContext, AsyncSession], Awaitable[None]]
DeadLetterSink = Callable[[Envelope, str, str, int], Any]

__all__ = ["AsyncInbox", "Inbox", "InboxSettings"]


def _split(
    handler: Callable[..., Any] | InboxSettings, settings: InboxSettings | None
) -> tuple[Callable[..., Any] | None, InboxSettings]:
    """``(engine, settings)`` (handlers in the registry) or ``(engine, handler, settings)``."""
    if isinstance(handler, InboxSettings) and settings is None:
        return None, handler
    if callable(handler) and isinstance(settings, InboxSettings):
        return handler, settings
    raise ConfigurationError("pass (engine, settings) or (engine, handler, settings)")


def _sink(dead_letter: DeadLetterSink | None) -> DeadLetterStep:
    def step(env: Envelope, event_id: str, error: str, attempts: int) -> Step | None:
        return None if dead_letter is None else Call(dead_letter, (env, event_id, error, attempts))

    return step


def _never() -> bool:
    return False


class _SyncSteps(StepsBase):
    def __init__(self, inbox: Inbox, extra: StepTable) -> None:
        self.inbox = inbox
        self.session: Session | None = None
        self.conn: Connection | None = None  # the session's own (see handler_session)
        super().__init__(inbox.lease, inbox.run_sql, extra)

    def handler_sql(self, step: HandlerSql) -> db.Result:
        assert self.session is not None
        still_on(self.conn, self.driver)
        return db.run(self.session, step.query, step.params, binary=step.binary)

    def _open(self) -> Session:
        """The handler's session on a connection of its own; BEGIN goes with its first statement."""
        self.session, self.conn = handler_session(self.inbox.engine)
        self.driver = driver_of(self.conn)
        return self.session

    def call_handler(self, step: CallHandler) -> None:
        session = self._open()
        returned_nothing(step.handler(step.event, step.ctx, session))
        session.flush()  # its writes fail here, as its own, not in the middleware's commit

    def open_handler(self, step: OpenHandler) -> None:
        self.close_handler(CloseHandler())
        self._open().begin()

    def run_in_transaction(self, step: RunInTransaction) -> None:
        session = self.session
        assert session is not None
        outer = session.get_transaction()
        try:
            returned_nothing(step.handler(*step.args, session))
            for ctx in step.contexts:
                ctx.check()
            session.flush()  # returns at once when nothing is pending (its own first test)
        except BaseException as exc:
            if (instead := instead_of_failure(exc, self.conn, session, outer, step)) is not None:
                raise instead from exc
            raise
        if (ended := transaction_ended(session, outer)) is not None:
            raise ended
        if (aborted := transaction_aborted(self.driver)) is not None:
            raise aborted

    def run_in_savepoint(self, step: RunInSavepoint) -> None:
        session = self.session
        assert session is not None
        nested = session.begin_nested()  # its SAVEPOINT goes with the handler's first statement
        try:
            self.run_in_transaction(step)
        except BatchTransactionEndedError:
            raise
        except BaseException:
            nested.rollback()  # this handler's writes only; the batch goes on
            raise
        with releasing(session, self.conn):
            nested.commit()

    def commit_handler(self, step: CommitHandler) -> None:
        session, self.session, conn, self.conn = self.session, None, self.conn, None
        assert session is not None
        assert conn is not None
        with conn, session:
            allow_commit(session)
            session.commit()
            committed(conn)

    def close_handler(self, step: CloseHandler) -> None:
        session, self.session, conn, self.conn = self.session, None, self.conn, None
        if conn is not None:
            with conn:
                if session is not None:
                    session.close()  # rolls back what the handler wrote

    def end_delivery(self, step: EndDelivery) -> None:
        self.stop_lease()
        self.close_handler(CloseHandler())

    def release(self, in_flight: Step | None) -> None:
        held = self.stopped()
        try:
            self.end_delivery(EndDelivery())  # rolls back first: a mark locks the rows
        finally:
            if held is not None:
                try:
                    drive_sync(held.claims.at_stop(in_flight), self)
                except BaseException as exc:
                    cut_short(exc)
                    raise


EngineT = TypeVar("EngineT", Engine, AsyncEngine)
HandlerT = TypeVar("HandlerT", SyncHandler, AsyncHandler)


class _InboxDriver(Generic[EngineT, HandlerT]):
    """``(engine, settings)`` calls the handlers registered with ``@registry.handler(...)``;
    ``(engine, handler, settings)`` also calls ``handler`` for every type without one."""

    _coroutines: ClassVar[bool]
    _keeper: ClassVar[type[LeaseThread] | type[LeaseTask]]

    def __init__(
        self,
        engine: EngineT,
        handler: HandlerT | InboxSettings,
        settings: InboxSettings | None = None,
        /,
    ) -> None:
        fallback, self.settings = _split(handler, settings)
        self.engine: EngineT = engine
        self.core = InboxCore(self.settings, fallback, coroutines=self._coroutines)
        self.lease = self._keeper(_Schedule(self.core.statements), self.run_sql)

    def run_sql(self, step: Sql) -> Any:
        """One bookkeeping statement on an autocommit connection of its own."""
        raise NotImplementedError


class Inbox(_InboxDriver[Engine, SyncHandler]):
    """Sync middleware (confluent-kafka adapter): handlers get a SQLAlchemy ``Session``."""

    _coroutines = False
    _keeper = LeaseThread
    lease: LeaseThread

    def run_sql(self, step: Sql) -> db.Result:
        with self.engine.connect() as conn:
            return db.run(isolated(conn, AUTOCOMMIT), step.query, step.params, binary=step.binary)

    def executor(self, extra: StepTable | None = None) -> _SyncSteps:
        """An executor of this inbox's steps (plus ``extra`` ones, e.g. a consumer's Kafka)."""
        return _SyncSteps(self, extra or {})

    def process(
        self,
        env: Envelope,
        *,
        revoked: Revoked = _never,
        dead_letter: DeadLetterSink | None = None,
    ) -> Outcome:
        """Run one delivery to its outcome (a consumer adapter calls this for you)."""
        return drive_sync(self.core.deliver(env, revoked, _sink(dead_letter)), self.executor())

    def close(self) -> None:
        """Stop the lease renewal thread (the adapter calls this on close)."""
        self.lease.close()


class _AsyncSteps(StepsBase):
    def __init__(self, inbox: AsyncInbox, extra: StepTable) -> None:
        self.inbox = inbox
        self.session: AsyncSession | None = None
        self.conn: AsyncConnection | None = None
        super().__init__(inbox.lease, inbox.run_sql, extra)

    async def handler_sql(self, step: HandlerSql) -> db.Result:
        assert self.session is not None
        still_on(self.conn, self.driver)
        return await db.run_async(self.session, step.query, step.params, binary=step.binary)

    async def _open(self) -> AsyncSession:
        """:meth:`_SyncSteps._open` for asyncio."""
        self.session, self.conn = await handler_session_async(self.inbox.engine)
        self.driver = driver_of(self.conn.sync_connection)
        return self.session

    async def call_handler(self, step: CallHandler) -> None:
        session = await self._open()
        await awaited(step.handler(step.event, step.ctx, session))
        await session.flush()  # its writes fail here, as its own, not in the middleware's commit

    async def open_handler(self, step: OpenHandler) -> None:
        await self.close_handler(CloseHandler())
        await (await self._open()).begin()

    async def run_in_transaction(self, step: RunInTransaction) -> None:
        session = self.session
        assert session is not None
        outer = session.sync_session.get_transaction()
        try:
            await awaited(step.handler(*step.args, session))
            for ctx in step.contexts:
                ctx.check()
            if pending(session.sync_session):
                await session.flush()
        except BaseException as exc:
            if (instead := instead_of_failure(exc, self.conn, session, outer, step)) is not None:
                raise instead from exc
            raise
        if (ended := transaction_ended(session.sync_session, outer)) is not None:
            raise ended
        if (aborted := transaction_aborted(self.driver)) is not None:
            raise aborted

    async def run_in_savepoint(self, step: RunInSavepoint) -> None:
        session = self.session
        assert session is not None
        nested = await session.begin_nested()
        try:
            await self.run_in_transaction(step)
        except BatchTransactionEndedError:
            raise
        except BaseException:
            await nested.rollback()
            raise
        with releasing(session.sync_session, self.conn):
            await nested.commit()

    async def commit_handler(self, step: CommitHandler) -> None:
        session, self.session, conn, self.conn = self.session, None, self.conn, None
        assert session is not None
        assert conn is not None
        try:  # (an AsyncConnection has no `async with` once started)
            async with session:
                allow_commit(session)
                await session.commit()
                committed(conn)
        finally:
            await conn.close()

    async def close_handler(self, step: CloseHandler) -> None:
        session, self.session, conn, self.conn = self.session, None, self.conn, None
        try:
            if session is not None:
                await session.close()
        finally:
            if conn is not None:
                await conn.close()

    async def end_delivery(self, step: EndDelivery) -> None:
        self.stop_lease()
        await self.close_handler(CloseHandler())

    async def release(self, in_flight: Step | None) -> None:
        held = self.stopped()
        try:
            await self.end_delivery(EndDelivery())
        finally:
            if held is not None:
                try:  # bounded: nothing else would end it (a cancellation comes once)
                    async with asyncio.timeout(STOP_GIVE_BACK_SECONDS):
                        await drive_async(held.claims.at_stop(in_flight), self)
                except BaseException as exc:
                    cut_short(exc)
                    if not isinstance(exc, TimeoutError):
                        raise


class AsyncInbox(_InboxDriver[AsyncEngine, AsyncHandler]):
    """Async middleware (aiokafka adapter): handlers are coroutines getting an ``AsyncSession``;
    ``await inbox.close()`` stops the lease task."""

    _coroutines = True
    _keeper = LeaseTask
    lease: LeaseTask

    async def run_sql(self, step: Sql) -> db.Result:
        async with self.engine.connect() as conn:
            await isolated_async(conn, AUTOCOMMIT)
            return await db.run_async(conn, step.query, step.params, binary=step.binary)

    def executor(self, extra: StepTable | None = None) -> _AsyncSteps:
        return _AsyncSteps(self, extra or {})

    async def process(
        self,
        env: Envelope,
        *,
        revoked: Revoked = _never,
        dead_letter: DeadLetterSink | None = None,
    ) -> Outcome:
        plan = self.core.deliver(env, revoked, _sink(dead_letter))
        return await drive_async(plan, self.executor())

    async def close(self) -> None:
        await self.lease.close()
