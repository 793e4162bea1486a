"""The writer's hold on the caller's connection, apart from what it writes: refused before
anything is sent when it cannot be written on (autocommit, a client_encoding not UTF8), and
the writer's statements on it, with text the database's encoding lacks told as a
:class:`ConfigurationError` instead of the driver's error.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import InvalidRequestError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
from sqlalchemy.orm import Session, scoped_session
from sqlalchemy.pool import PoolProxiedConnection

from outboxkit import db
from outboxkit.errors import ConfigurationError
from outboxkit.outbox_target import wrong_target

SyncTarget = Session | Connection
AsyncTarget = AsyncSession | AsyncConnection


def execute(conn: Connection, schema: str, name: str, params: dict[str, Any]) -> list[Any]:
    """One statement on the caller's connection (binary parameters: cheaper arrays). Text the
    database's encoding lacks is a ConfigurationError (raised outside the handler: no context
    quoting its bytes); the caller's transaction is aborted, as by any failed statement."""
    query = db.query("outbox", name, schema)
    try:
        return db.run(conn, query, params, binary=True).rows
    except sa.exc.DataError as exc:
        error = db.untranslatable(exc, query, conn)
        if error is None:
            raise
    raise error


async def execute_async(
    conn: AsyncConnection, schema: str, name: str, params: dict[str, Any]
) -> list[Any]:
    query = db.query("outbox", name, schema)
    try:
        return (await db.run_async(conn, query, params, binary=True)).rows
    except sa.exc.DataError as exc:
        error = db.untranslatable(exc, query, conn)
        if error is None:
            raise
    raise error


def _autocommit_refused() -> ConfigurationError:
    return ConfigurationError(
        "the outbox writes in the caller's transaction, but this connection is in autocommit"
        " mode (isolation_level='AUTOCOMMIT'): the row would commit at once, apart from the"
        " caller's own changes; write on a Session or Connection in a transaction"
    )


def _refused(raw: PoolProxiedConnection) -> ConfigurationError | None:
    """Why the caller's connection cannot be written on, read before anything is written, with
    no round trip (the write is hot): autocommit mode (each statement would commit on its own,
    and add_many's savepoint would fail), or a client_encoding not UTF8 (:func:`db.not_utf8`)."""
    dbapi = raw.dbapi_connection
    if getattr(dbapi, "autocommit", False):
        return _autocommit_refused()
    return db.not_utf8(dbapi)


def connection(target: SyncTarget) -> tuple[Connection, int]:
    """The caller's connection, if fit to write on (:func:`_refused`), and its driver
    connection's id (the key of :data:`~outboxkit.outbox_target.WRITING`). A wrong target is
    named only once reading its connection failed (no type check on the hot path)."""
    conn = target.connection() if isinstance(target, Session) else target
    try:
        raw = conn.connection
        dbapi = raw.dbapi_connection
    except (AttributeError, InvalidRequestError):  # AsyncConnection.connection raises the latter
        if isinstance(conn, Connection):
            raise
        if isinstance(target, scoped_session):  # its scope's session (not on the hot path)
            return connection(target())
        wrong_target(target, asynchronous=False)
    refused = _refused(raw)
    if refused is not None:
        raise refused
    return conn, id(dbapi)


async def connection_async(target: AsyncTarget) -> tuple[AsyncConnection, int]:
    try:
        conn = await target.connection() if isinstance(target, AsyncSession) else target
        sync = conn.sync_connection  # None until started: the write then fails as it would have
    except AttributeError:
        if isinstance(target, AsyncSession | AsyncConnection):
            raise
        if isinstance(target, async_scoped_session):  # its scope's session
            return await connection_async(target())
        wrong_target(target, asynchronous=True)
    if sync is None:
        return conn, id(conn)
    # An invalidated connection reconnects on first use, which is I/O: only in a greenlet.
    raw = await conn.get_raw_connection() if sync.invalidated else sync.connection
    refused = _refused(raw)
    if refused is not None:
        raise refused
    return conn, id(raw.dbapi_connection)
