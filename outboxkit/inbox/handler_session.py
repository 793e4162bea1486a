"""The handler's session in a batch: what the drivers check around each handler call.

A handler gets a session whose commits are refused (its writes commit with the ``succeeded``
mark). After it returns, the driver checks that it neither ended the batch's transaction nor
left it aborted: either would take the other handlers' writes with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from psycopg.pq import TransactionStatus
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session, SessionTransaction

from outboxkit.errors import (
    BatchTransactionEndedError,
    HandlerCommitError,
    HandlerTransactionAbortedError,
)

COMMIT_ALLOWED = "outboxkit.inbox.commit_allowed"


class HandlerSession(Session):
    """The handler's session: a commit issued by the handler itself is refused.

    The handler's writes must commit together with the ``succeeded`` mark; a commit inside the
    handler would make them durable before the token check and break exactly-once.
    """


@sa_event.listens_for(HandlerSession, "before_commit")
def _refuse_handler_commit(session: Session) -> None:
    if not session.info.get(COMMIT_ALLOWED):
        raise HandlerCommitError()


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
def releasing(session: Session) -> Iterator[None]:
    """Our own release of a handler's savepoint (SQLAlchemy calls it a commit) is allowed."""
    session.info[COMMIT_ALLOWED] = True
    try:
        yield
    finally:
        session.info[COMMIT_ALLOWED] = False
