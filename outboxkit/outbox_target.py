"""The caller's connection for a write: checked before anything is sent to it.

A write runs several statements on one connection (a savepoint, the insert, re-reads) and its
results are only true if nothing else runs there meanwhile. Two writes interleaved on one
connection (tasks gathered on one AsyncSession, threads sharing one Session) would nest their
savepoints wrongly, and one's rollback could undo rows the other already reported written; so
a write marks its connection and a second one starting there is refused. The mark is one dict
entry per write in progress (``dict.setdefault`` is atomic: two threads cannot both take it).
"""

from __future__ import annotations

from typing import NoReturn

from sqlalchemy.engine import Connection
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from outboxkit.errors import ConfigurationError, SharedConnectionError, WrongTargetError

SyncTarget = Session | Connection
AsyncTarget = AsyncSession | AsyncConnection

# id() of the driver connection a write is running on -> that write's token. A write takes its
# entry with ``WRITING.setdefault(key, token) is token`` and deletes it when done: inline in
# the writer, two dict operations (about 70 ns) on the single add's hot path.
WRITING: dict[int, object] = {}


def _autocommit_refused() -> ConfigurationError:
    return ConfigurationError(
        "the outbox writes in the caller's transaction, but this connection is in autocommit"
        " mode (isolation_level='AUTOCOMMIT'): the row would commit at once, apart from the"
        " caller's own changes; write on a Session or Connection in a transaction"
    )


def _wrong_target(target: object, asynchronous: bool) -> NoReturn:
    """Named only once the target failed (no type check on the hot path)."""
    given = f"{type(target).__module__}.{type(target).__qualname__}"
    if asynchronous:
        accepted, other = "an AsyncSession or AsyncConnection", "add/add_many"
    else:
        accepted, other = "a Session or Connection", "add_async/add_many_async"
    hint = (
        f" (for {'sync' if asynchronous else 'async'} ones use {other})"
        if isinstance(target, AsyncSession | AsyncConnection | Session | Connection)
        else ""
    )
    raise WrongTargetError(
        f"the outbox writes on {accepted} of SQLAlchemy in a transaction, got {given}{hint}"
    )


def check(target: object, asynchronous: bool) -> None:
    """Refuse a wrong target where nothing is written (an empty add_many), as a write would."""
    kinds = (AsyncSession, AsyncConnection) if asynchronous else (Session, Connection)
    if not isinstance(target, kinds):
        _wrong_target(target, asynchronous)


def connection(target: SyncTarget) -> tuple[Connection, int]:
    """The caller's connection and its driver connection's id, refused in autocommit mode
    before anything is written: each statement would commit on its own (one transaction or
    neither no longer holds) and add_many's savepoint would fail. One attribute read, no round
    trip: the write is hot."""
    conn = target.connection() if isinstance(target, Session) else target
    try:
        raw = conn.connection.dbapi_connection
    except (AttributeError, InvalidRequestError):  # AsyncConnection.connection raises the latter
        if isinstance(conn, Connection):
            raise
        _wrong_target(target, asynchronous=False)
    if getattr(raw, "autocommit", False):
        raise _autocommit_refused()
    return conn, id(raw)


async def connection_async(target: AsyncTarget) -> tuple[AsyncConnection, int]:
    try:
        conn = await target.connection() if isinstance(target, AsyncSession) else target
        sync = conn.sync_connection  # None until started: the write then fails as it would have
    except AttributeError:
        if isinstance(target, AsyncSession | AsyncConnection):
            raise
        _wrong_target(target, asynchronous=True)
    if sync is None:
        return conn, id(conn)
    # An invalidated connection reconnects on first use, which is I/O: only in a greenlet.
    raw = await conn.get_raw_connection() if sync.invalidated else sync.connection
    if getattr(raw.dbapi_connection, "autocommit", False):
        raise _autocommit_refused()
    return conn, id(raw.dbapi_connection)


def shared_connection() -> SharedConnectionError:
    """Raised when a write finds its connection in :data:`WRITING` under another write."""
    return SharedConnectionError(
        "another outbox write is running on this connection: one Session or Connection"
        " (AsyncSession or AsyncConnection) may serve one thread or task at a time, as"
        " SQLAlchemy requires; interleaved writes could lose rows they reported written."
        " Use a session per task (or await the writes one after another)"
    )
