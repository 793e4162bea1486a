"""Run a named statement: on the caller's connection (and so in its transaction) or on ours.

A target is a SQLAlchemy ``Session``/``Connection`` (or their async twins) or a psycopg
connection. With psycopg underneath (the driver outboxkit requires) the statement goes straight to
the driver connection SQLAlchemy holds, so a write costs no SQLAlchemy compilation; any other
driver runs the same ``:name`` text through SQLAlchemy. Errors keep the family of the target: a
SQLAlchemy target gets SQLAlchemy exceptions (with bound parameters hidden), a psycopg target gets
psycopg's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from outboxkit.db.queries import Query

SyncTarget = Session | Connection | psycopg.Connection[Any]
AsyncTarget = AsyncSession | AsyncConnection | psycopg.AsyncConnection[Any]
Params = Mapping[str, Any] | None


class Result(NamedTuple):
    """Rows as plain tuples (whatever the driver) and the statement's row count."""

    rows: list[tuple[Any, ...]]
    rowcount: int


def _wrap(exc: psycopg.Error, query: Query) -> sa.exc.StatementError:
    """A driver error as SQLAlchemy would have raised it, without the parameters' values."""
    return sa.exc.DBAPIError.instance(
        f"outboxkit {query.area}.{query.name}", None, exc, psycopg.Error, hide_parameters=True
    )


def _sql(query: Query, binary: bool) -> bytes:
    return query.psycopg_binary if binary else query.psycopg


def _via_sqlalchemy(result: sa.CursorResult[Any]) -> Result:
    rows = [tuple(row) for row in result] if result.returns_rows else []
    return Result(rows, result.rowcount)


def run(target: SyncTarget, query: Query, params: Params = None, *, binary: bool = False) -> Result:
    """Execute ``query`` on ``target``; a SQLAlchemy target begins its transaction if needed."""
    if isinstance(target, psycopg.Connection):
        with target.cursor() as cur:
            cur.execute(_sql(query, binary), params)
            return Result(cur.fetchall() if cur.description else [], cur.rowcount)
    conn = target.connection() if isinstance(target, Session) else target
    if not conn.in_transaction():
        conn.begin()  # what conn.execute would do (autobegin); the caller commits
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        return _via_sqlalchemy(conn.execute(sa.text(query.text), dict(params or {})))
    try:
        return run(driver, query, params, binary=binary)
    except psycopg.Error as exc:
        raise _wrap(exc, query) from exc


async def run_async(
    target: AsyncTarget, query: Query, params: Params = None, *, binary: bool = False
) -> Result:
    """:func:`run` for async targets."""
    if isinstance(target, psycopg.AsyncConnection):
        async with target.cursor() as cur:
            await cur.execute(_sql(query, binary), params)
            return Result(await cur.fetchall() if cur.description else [], cur.rowcount)
    conn = await target.connection() if isinstance(target, AsyncSession) else target
    if not conn.in_transaction():
        await conn.begin()
    driver = (await conn.get_raw_connection()).driver_connection
    if not isinstance(driver, psycopg.AsyncConnection):
        return _via_sqlalchemy(await conn.execute(sa.text(query.text), dict(params or {})))
    try:
        return await run_async(driver, query, params, binary=binary)
    except psycopg.Error as exc:
        raise _wrap(exc, query) from exc


def execute(target: SyncTarget, query: Query, params: Params = None) -> int:
    """Run a statement; its row count."""
    return run(target, query, params).rowcount


def one(target: SyncTarget, query: Query, params: Params = None) -> tuple[Any, ...] | None:
    """The first row, or None."""
    rows = run(target, query, params).rows
    return rows[0] if rows else None


def rows(target: SyncTarget, query: Query, params: Params = None) -> Sequence[tuple[Any, ...]]:
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
