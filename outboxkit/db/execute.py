"""Run a named statement: on the caller's connection (and so in its transaction) or on ours.

A target is a SQLAlchemy ``Session``/``Connection`` (or their async twins) or a psycopg
connection. With psycopg underneath (the driver outboxkit requires) the statement goes straight to
the driver connection SQLAlchemy holds, so a write costs no SQLAlchemy compilation; any other
driver runs the same ``:name`` text through SQLAlchemy. Errors keep the family of the target: a
SQLAlchemy target gets SQLAlchemy exceptions (with bound parameters hidden, as they may hold
payloads), a psycopg target gets psycopg's. A connection the error broke is invalidated, as
SQLAlchemy does for its own statements, so the pool never hands it out again. Results come in
PostgreSQL's binary format: a database's output settings (``DateStyle``, ``IntervalStyle``,
``extra_float_digits``, ``bytea_output``) change how the server writes values as text, and
psycopg parses a timestamp written as text only under ``DateStyle`` ISO. A statement that is its
own transaction runs at READ COMMITTED, and again if it lost a race (``own_transaction``). A
parameter the caller's session encoding cannot carry is a :class:`ConfigurationError` (our own
connections use UTF8: ``start_options``); the writer refuses a session not in UTF8 outright
(:func:`not_utf8`), and text its database's encoding lacks (:func:`untranslatable`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import psycopg
import sqlalchemy as sa
from psycopg.rows import tuple_row
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from outboxkit.db import own_transaction
from outboxkit.db.queries import Query
from outboxkit.errors import ConfigurationError

SyncTarget = Session | Connection | psycopg.Connection[Any]
AsyncTarget = AsyncSession | AsyncConnection | psycopg.AsyncConnection[Any]
Params = Mapping[str, Any] | None
_NO_PARAMS: Mapping[str, Any] = {}


class Result(NamedTuple):
    """Rows as plain tuples (whatever the driver) and the statement's row count."""

    rows: list[tuple[Any, ...]]
    rowcount: int


def _checked(query: Query, params: Params) -> Mapping[str, Any]:
    """The parameters, if they name every placeholder (a caller's bug, told plainly)."""
    given = _NO_PARAMS if params is None else params
    if not query.parameters <= given.keys():
        missing = sorted(query.parameters - given.keys())
        raise TypeError(f"outboxkit {query.area}.{query.name}: missing parameters {missing}")
    return given


def _wrap(exc: psycopg.Error, query: Query, invalidated: bool) -> sa.exc.StatementError:
    """A driver error as SQLAlchemy would have raised it, without the parameters' values."""
    return sa.exc.DBAPIError.instance(
        f"outboxkit {query.area}.{query.name}",
        None,
        exc,
        psycopg.Error,
        hide_parameters=True,
        connection_invalidated=invalidated,
    )


def _sql(query: Query, binary: bool) -> bytes:
    return query.psycopg_binary if binary else query.psycopg


def _via_sqlalchemy(result: sa.CursorResult[Any]) -> Result:
    rows = [tuple(row) for row in result] if result.returns_rows else []
    return Result(rows, result.rowcount)


def _fetch(driver: psycopg.Connection[Any], sql: bytes, params: Mapping[str, Any]) -> Result:
    with driver.cursor(row_factory=tuple_row) as cur:
        cur.execute(sql, params, binary=True)
        return Result(cur.fetchall() if cur.description else [], cur.rowcount)


async def _fetch_async(
    driver: psycopg.AsyncConnection[Any], sql: bytes, params: Mapping[str, Any]
) -> Result:
    async with driver.cursor(row_factory=tuple_row) as cur:
        await cur.execute(sql, params, binary=True)
        return Result(await cur.fetchall() if cur.description else [], cur.rowcount)


def _unencodable(
    driver: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], query: Query
) -> ConfigurationError:
    """A value the session's ``client_encoding`` cannot carry (a database or role default such
    as LATIN1, on a connection not ours), told without the text (it may be a payload's). Such
    a statement is not sent, so the caller's transaction is as it was; a COPY is ended, and
    its caller's savepoint takes its rows back."""
    encoding = driver.info.parameter_status("client_encoding") or driver.info.encoding
    return ConfigurationError(
        f"outboxkit {query.area}.{query.name}: a value sent holds a character the connection's"
        f" client_encoding ({encoding}) cannot carry; outboxkit's statements need UTF8 (e.g. the"
        " engine's connect_args={'client_encoding': 'UTF8'})"
    )


_DRIVERS = (psycopg.Connection, psycopg.AsyncConnection)


def not_utf8(dbapi: object) -> ConfigurationError | None:
    """A caller's connection (the DBAPI one SQLAlchemy's pool holds: psycopg's, or SQLAlchemy's
    asyncio adapter of it) whose ``client_encoding`` is not UTF8 (a database or role default,
    ``PGCLIENTENCODING``): the writer's refusal, before anything is sent. Python's codecs and
    PostgreSQL's conversions disagree on some characters (EUC_JP, SJIS: ``¥`` is stored as a
    backslash, so two idempotency keys become one) and an SJIS character ending in byte 0x5C
    breaks COPY's escapes. Read from the session's parameter status, no round trip (the single
    write is hot). Another driver is not asked."""
    driver = (
        dbapi if type(dbapi) is psycopg.Connection else getattr(dbapi, "driver_connection", dbapi)
    )
    if not isinstance(driver, _DRIVERS):
        return None
    encoding = driver.pgconn.parameter_status(b"client_encoding")
    if encoding == b"UTF8":
        return None
    name = (encoding or b"unknown").decode("ascii", "replace")
    return ConfigurationError(
        f"outboxkit outbox: the connection's client_encoding is {name}, but the writer needs"
        " UTF8 (in other encodings text can change on its way, and two keys become one); ask"
        " for it, e.g. the engine's connect_args={'client_encoding': 'UTF8'}"
    )


def untranslatable(
    exc: sa.exc.DBAPIError, query: Query, conn: Connection | AsyncConnection
) -> ConfigurationError | None:
    """The server's refusal of text its database's encoding lacks (a LATIN1 database, a key in
    Japanese) as a :class:`ConfigurationError` naming that encoding, without the text (the
    server's message quotes the character's bytes); None for any other error."""
    if not isinstance(exc.orig, psycopg.errors.UntranslatableCharacter):
        return None
    sync = conn.sync_connection if isinstance(conn, AsyncConnection) else conn
    driver = None if sync is None else sync.connection.driver_connection  # not invalidated
    encoding = None
    if isinstance(driver, _DRIVERS):
        encoding = driver.pgconn.parameter_status(b"server_encoding")
    name = (encoding or b"unknown").decode("ascii", "replace")
    return ConfigurationError(
        f"outboxkit {query.area}.{query.name}: a text value (a key, the idempotency key, a"
        f" header, the event type, an aggregate's type or id) holds a character the database's"
        f" encoding ({name}) lacks; such text needs a UTF8 database"
    )


def _on_driver(
    driver: psycopg.Connection[Any], query: Query, binary: bool, params: Mapping[str, Any]
) -> Result:
    sql = _sql(query, binary)
    try:
        return own_transaction.run(driver, lambda: _fetch(driver, sql, params))
    except UnicodeEncodeError:
        error = _unencodable(driver, query)
    raise error  # outside the except block: no context holding the text


async def _on_driver_async(
    driver: psycopg.AsyncConnection[Any], query: Query, binary: bool, params: Mapping[str, Any]
) -> Result:
    sql = _sql(query, binary)
    try:
        return await own_transaction.run_async(driver, lambda: _fetch_async(driver, sql, params))
    except UnicodeEncodeError:
        error = _unencodable(driver, query)
    raise error


def run(target: SyncTarget, query: Query, params: Params = None, *, binary: bool = False) -> Result:
    """Execute ``query`` on ``target``; a SQLAlchemy target begins its transaction if needed.
    ``binary``: the parameters too travel in the binary format (results always do)."""
    given = _checked(query, params)
    if isinstance(target, psycopg.Connection):
        return _on_driver(target, query, binary, given)
    conn = target.connection() if isinstance(target, Session) else target
    if not conn.in_transaction():
        conn.begin()  # what conn.execute would do (autobegin); the caller commits
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        return _via_sqlalchemy(conn.execute(sa.text(query.text), dict(given)))
    try:
        return _on_driver(driver, query, binary, given)
    except psycopg.Error as exc:
        if driver.broken:
            conn.invalidate(exc)
        raise _wrap(exc, query, driver.broken) from exc


async def run_async(
    target: AsyncTarget, query: Query, params: Params = None, *, binary: bool = False
) -> Result:
    """:func:`run` for async targets."""
    given = _checked(query, params)
    if isinstance(target, psycopg.AsyncConnection):
        return await _on_driver_async(target, query, binary, given)
    conn = await target.connection() if isinstance(target, AsyncSession) else target
    if not conn.in_transaction():
        await conn.begin()
    driver = (await conn.get_raw_connection()).driver_connection
    if not isinstance(driver, psycopg.AsyncConnection):
        return _via_sqlalchemy(await conn.execute(sa.text(query.text), dict(given)))
    try:
        return await _on_driver_async(driver, query, binary, given)
    except psycopg.Error as exc:
        if driver.broken:
            await conn.invalidate(exc)
        raise _wrap(exc, query, driver.broken) from exc


def execute(target: SyncTarget, query: Query, params: Params = None) -> int:
    """Run a statement; its row count."""
    return run(target, query, params).rowcount


def one(target: SyncTarget, query: Query, params: Params = None) -> tuple[Any, ...] | None:
    """The first row, or None."""
    found = run(target, query, params).rows
    return found[0] if found else None


def rows(target: SyncTarget, query: Query, params: Params = None) -> Sequence[tuple[Any, ...]]:
    """Every row."""
    return run(target, query, params).rows


async def execute_async(target: AsyncTarget, query: Query, params: Params = None) -> int:
    return (await run_async(target, query, params)).rowcount


async def one_async(
    target: AsyncTarget, query: Query, params: Params = None
) -> tuple[Any, ...] | None:
    found = (await run_async(target, query, params)).rows
    return found[0] if found else None


async def rows_async(
    target: AsyncTarget, query: Query, params: Params = None
) -> Sequence[tuple[Any, ...]]:
    return (await run_async(target, query, params)).rows
