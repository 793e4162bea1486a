"""The handler's session in a batch: what the drivers check around each handler call.

A handler gets a session whose commits are refused (its writes commit with the ``succeeded``
mark). After it returns, the driver checks that it neither ended the batch's transaction nor
left it aborted: either would take the other handlers' writes with it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Iterator
from typing import Any

from psycopg.pq import TransactionStatus
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session, SessionTransaction

from outboxkit.errors import (
    BatchTransactionEndedError,
    ConfigurationError,
    HandlerCommitError,
    HandlerTransactionAbortedError,
    LeaseLostError,
)
from outboxkit.inbox.commit_guard import guard
from outboxkit.inbox.steps import RunInSavepoint, RunInTransaction

COMMIT_ALLOWED = "outboxkit.inbox.commit_allowed"

# Levels are set on each connection the middleware takes, never on an engine made from yours:
# an engine's own isolation_level option (``engine.execution_options(isolation_level=...)``)
# wins over one set on an engine made from it, so bookkeeping meant to commit at once did not,
# and nothing was ever claimed.
AUTOCOMMIT = {"isolation_level": "AUTOCOMMIT"}  # the claims, marks and renewals: one each
# The handlers' transaction runs at READ COMMITTED whatever the engine's or the server's default.
# At REPEATABLE READ or SERIALIZABLE a lease renewal of the event's row during the handler made
# the token-conditional mark fail with a serialization failure (a handler outliving the renewal
# interval never succeeded); on an AUTOCOMMIT engine each handler statement committed at once.
HANDLER_ISOLATION: dict[str, Any] = {"isolation_level": "READ COMMITTED"}


class HandlerSession(Session):
    """The handler's session: a commit issued by the handler itself is refused.

    The handler's writes must commit together with the ``succeeded`` mark; a commit inside the
    handler would make them durable before the token check and break exactly-once.
    """


@sa_event.listens_for(HandlerSession, "before_commit")
def _refuse_handler_commit(session: Session) -> None:
    if not session.info.get(COMMIT_ALLOWED):
        raise HandlerCommitError()


def allow_commit(session: Session | AsyncSession) -> None:
    """Our own commit of the handler's session (the handler's are refused)."""
    session.info[COMMIT_ALLOWED] = True


def transaction_ended(
    session: Session, outer: SessionTransaction | None
) -> BatchTransactionEndedError | None:
    """An error if the handler ended the batch's transaction: a ``session.rollback()`` inside a
    savepoint rolls back the whole transaction in SQLAlchemy 2, not only the savepoint."""
    if outer is not None and session.get_transaction() is outer and outer.is_active:
        return None
    return BatchTransactionEndedError(
        "a handler rolled back the batch's transaction; the batch runs again one by one"
    )


def instead_of_failure(
    exc: BaseException,
    conn: Connection | AsyncConnection | None,
    session: Session | AsyncSession,
    outer: SessionTransaction | None,
    step: RunInTransaction,
) -> BatchTransactionEndedError | None:
    """What a batch raises instead of a handler's failure ``exc``, when the batch's transaction
    is gone with it and the batch runs again one by one: its connection was lost (broken, or
    ended by the server: ``idle_in_transaction_session_timeout`` after an earlier handler's
    long wait would otherwise count as the failure of the handler that ran next), or the
    handler rolled back in its savepoint (:func:`transaction_ended`). Run alone, each event
    then counts its own failures. A stop (not an ``Exception``) is never replaced (before, one in
    a savepoint the handler had rolled back became a rerun, and the consumer went on); a lost
    lease is never taken for a lost connection; without a savepoint any other failure stays
    itself (the transaction is rolled back anyway, and the handler's own error is the one to
    report)."""
    if not isinstance(exc, Exception):  # a stop stays a stop, whatever the transaction did
        return None
    if not isinstance(exc, LeaseLostError) and (lost := _connection_lost(conn)) is not None:
        return lost
    if not isinstance(step, RunInSavepoint):
        return None
    sync_session = session.sync_session if isinstance(session, AsyncSession) else session
    return transaction_ended(sync_session, outer)


def _connection_lost(
    conn: Connection | AsyncConnection | None,
) -> BatchTransactionEndedError | None:
    sync = _sync(conn)
    if sync is None or not sync.invalidated:
        return None
    return BatchTransactionEndedError(
        "the batch's connection was lost during a handler (broken, or ended by the server);"
        " the batch runs again one by one"
    )


@contextlib.contextmanager
def _lost_ends_batch(conn: Connection | AsyncConnection | None) -> Iterator[None]:
    """A savepoint's RELEASE that failed with the connection: where a handler's long wait shows
    first (the server ended the session meanwhile) in a batch run in savepoints. The batch runs
    again one by one, as after a handler's failure with it (:func:`instead_of_failure`, which
    also covers the SAVEPOINT: it goes with the handler's first statement)."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, BatchTransactionEndedError) or (lost := _connection_lost(conn)) is None:
            raise
        raise lost from exc


def driver_of(conn: Connection | None) -> Any:
    """The driver's own connection under ``conn`` (a psycopg connection, or another driver's)."""
    return None if conn is None else conn.connection.driver_connection


def pending(session: Session) -> bool:
    """Whether a flush has anything to write (a flush costs an await even when it has not).

    The flush's own test (new, deleted or modified objects), without building the set of dirty
    ones: ``session.dirty`` is the modified ones less the deleted ones."""
    return bool(session.new or session.deleted) or session.identity_map.check_modified()


def transaction_aborted(driver: Any) -> HandlerTransactionAbortedError | None:
    """An error if the handler left the transaction aborted (it caught a database error and went
    on). psycopg knows the transaction's status from the last reply: no round trip. Read from
    ``pgconn`` (an int): ``driver.info`` builds an object and an enum on every call."""
    pgconn = getattr(driver, "pgconn", None)
    if pgconn is None or pgconn.transaction_status != TransactionStatus.INERROR:
        return None
    return HandlerTransactionAbortedError(
        "the handler left its transaction aborted (a database error caught without rolling"
        " back to a savepoint of its own)"
    )


@contextlib.contextmanager
def releasing(session: Session, conn: Connection | AsyncConnection | None) -> Iterator[None]:
    """Our own release of a handler's savepoint (SQLAlchemy calls it a commit) is allowed; one
    that failed with the connection ends the batch (:func:`_lost_ends_batch`)."""
    session.info[COMMIT_ALLOWED] = True
    try:
        with _lost_ends_batch(conn):
            yield
    finally:
        session.info[COMMIT_ALLOWED] = False


def returned_nothing(value: Any) -> None:
    """What a sync handler returned is ignored (a batch handler may return its results), unless
    its body has not run: a coroutine or a generator means an async handler, or a generator
    function, given to Inbox."""
    if value is None or not (
        inspect.isawaitable(value) or inspect.isgenerator(value) or inspect.isasyncgen(value)
    ):
        return
    if inspect.iscoroutine(value):
        value.close()  # never awaited, on purpose: no warning for it
    raise ConfigurationError(
        "an Inbox handler must run when called: it returned a coroutine or a generator (an"
        " async handler, or a generator function?)"
    )


def awaited(returned: Any) -> Awaitable[Any]:
    """What an async handler returned, to await: anything else is a sync handler."""
    if not inspect.isawaitable(returned):
        raise ConfigurationError("an AsyncInbox handler must be a coroutine function")
    return returned


# The session commits and rolls back the connection's transaction even if something else began
# it (a handler running SQL on ``session.get_bind()`` before the session's first statement):
# joined as a guest, its commit would commit nothing, and closing the connection would roll the
# handler's writes and the mark back after the delivery counted as succeeded.
_OWNED: dict[str, Any] = {"join_transaction_mode": "control_fully"}


def _sync(conn: Connection | AsyncConnection | None) -> Connection | None:
    return conn.sync_connection if isinstance(conn, AsyncConnection) else conn


def still_on(conn: Connection | AsyncConnection | None, driver: Any) -> None:
    """Raise unless ``conn`` still runs on ``driver``, the psycopg connection the handler's
    run began on: SQLAlchemy opens a lost connection again at the engine's own level, where the
    mark could commit on its own (autocommit) or fail on a renewal (serializable)."""
    sync = _sync(conn)
    if sync is not None and sync.invalidated:  # (reading its connection would raise
        # SQLAlchemy's PendingRollbackError, which does not say what happened)
        raise HandlerTransactionAbortedError(
            "the handler's connection was lost (broken, or ended by the server: an"
            " idle_in_transaction_session_timeout, say): its transaction is gone"
        )
    if driver_of(sync) is not driver:
        raise HandlerTransactionAbortedError(
            "the handler's connection was lost and opened again: its transaction is gone"
        )


def committed(conn: Connection | AsyncConnection) -> None:
    """Raise if ``conn`` still holds a transaction once the session committed (what the
    delivery would otherwise count as succeeded would roll back when it is closed)."""
    if conn.in_transaction():  # (an AsyncConnection's asks its sync connection: no await)
        raise HandlerTransactionAbortedError("the handler's transaction did not commit")


def isolated(conn: Connection, options: dict[str, Any]) -> Connection:
    """``conn`` at the level ``options`` name. What an ``engine_connect`` listener of yours ran
    on it (``SET application_name``, say) began a transaction, in which no level can be set:
    it is committed first."""
    if conn.in_transaction():
        conn.commit()
    conn.execution_options(**options)
    return conn


async def isolated_async(conn: AsyncConnection, options: dict[str, Any]) -> AsyncConnection:
    """:func:`isolated` for asyncio."""
    if conn.in_transaction():
        await conn.commit()
    await conn.execution_options(**options)
    return conn


def handler_session(engine: Engine) -> tuple[HandlerSession, Connection]:
    """A handler's session bound to a connection of its own at READ COMMITTED: every
    transaction the session begins on it keeps the level, also after a handler's own rollback
    (a session bound to the engine would take another connection, at the engine's level)."""
    conn = engine.connect()
    try:
        session = HandlerSession(bind=isolated(conn, HANDLER_ISOLATION), **_OWNED)
        guard(driver_of(conn), engine)
        return session, conn
    except BaseException:
        conn.close()
        raise


async def handler_session_async(engine: AsyncEngine) -> tuple[AsyncSession, AsyncConnection]:
    """:func:`handler_session` for asyncio."""
    conn = await engine.connect()
    try:
        await isolated_async(conn, HANDLER_ISOLATION)
        guard(driver_of(conn.sync_connection), engine.sync_engine)
        return AsyncSession(bind=conn, sync_session_class=HandlerSession, **_OWNED), conn
    except BaseException:
        await conn.close()
        raise
