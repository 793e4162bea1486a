"""COPY rows into a table on the caller's connection (psycopg only).

A COPY streams rows in PostgreSQL's text format, which psycopg formats in C: for large batches
it costs the client and the server far less than the same rows as bound arrays. It has no
``ON CONFLICT`` and no ``RETURNING``; callers run it in a savepoint and know what to do when
it fails. Errors reach the caller as :func:`outboxkit.db.run` raises them.

An error of the rows themselves (an item refused while the COPY streams) ends the COPY with a
fixed message: psycopg would send the error's text, which the server logs and which may quote
an item's values (a header, a key). The caller still gets its own exception, unchanged.

A stop (a task's cancellation, a ``KeyboardInterrupt``) that comes while psycopg starts the COPY
can leave the server in it with nothing to end it: psycopg's cancel request does not reach a
server waiting for COPY data, and the object that would end it was never made. Such a
connection answers every later statement with "another command is already in progress", and
that error replaced the stop for the caller (a rollback, a pool's reset). It is invalidated
(closed, if it is the caller's psycopg connection) and the stop goes on unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg import AsyncCopy, Copy
from psycopg.pq import PipelineStatus, TransactionStatus
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outboxkit.db.execute import AsyncTarget, SyncTarget, _unencodable, _wrap
from outboxkit.db.queries import Query

Rows = Iterable[Sequence[Any]]


class _RowRefused(Exception):
    """Stands in for the caller's error at the end of the COPY: the server gets this text."""

    def __init__(self) -> None:
        super().__init__("outboxkit stopped the COPY: a row was refused before it was sent")


def _mid_copy(driver: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a statement is still under way on ``driver``: after a COPY that raised, one
    that a stop left the server in (nothing else ends it). In pipeline mode (where psycopg
    refuses a COPY) commands queued are under way too: that connection is fine."""
    pgconn = driver.pgconn
    return (
        pgconn.transaction_status == TransactionStatus.ACTIVE
        and pgconn.pipeline_status == PipelineStatus.OFF
    )


def _check(query: Query) -> None:
    if not query.text.upper().startswith("COPY ") or query.parameters:
        raise TypeError(f"outboxkit {query.area}.{query.name}: not a parameterless COPY")


def can_copy(target: SyncTarget) -> bool:
    """Whether :func:`copy_rows` can COPY on this target (psycopg underneath): asked first, so
    that nothing is prepared, and no id taken, for a COPY that would not happen."""
    if isinstance(target, psycopg.Connection):
        return True
    conn = target.connection() if isinstance(target, Session) else target
    return isinstance(conn.connection.driver_connection, psycopg.Connection)


async def can_copy_async(target: AsyncTarget) -> bool:
    """:func:`can_copy` for async targets."""
    if isinstance(target, psycopg.AsyncConnection):
        return True
    conn = await target.connection() if isinstance(target, AsyncSession) else target
    return isinstance((await conn.get_raw_connection()).driver_connection, psycopg.AsyncConnection)


class _Refusals:
    """Around a COPY: the error of a row stands in as :class:`_RowRefused` while the COPY ends
    (psycopg sends that text to the server); :meth:`reraise` then raises the caller's own
    error, unchanged (outside any handler: no context added). Should ending the COPY fail too
    (a broken connection), that error leaves with the caller's as its cause."""

    def __init__(self) -> None:
        self.error: Exception | None = None

    def refuse(self, exc: Exception) -> _RowRefused:
        self.error = exc
        return _RowRefused()

    def reraise(self) -> None:
        if self.error is not None:
            raise self.error

    def __enter__(self) -> _Refusals:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> bool:
        if self.error is None or exc is None:
            return False
        if isinstance(exc, _RowRefused):
            return True  # the COPY ended with the fixed text: reraise() follows
        exc.__cause__ = self.error
        return False


def _written(
    driver: psycopg.Connection[Any], copy: Copy, query: Query, rows: Rows
) -> Exception | None:
    """Every row written, or the error that stopped it: an error of ``rows`` (the caller's own,
    e.g. an item refused while prepared), or a value the session's encoding cannot carry
    (:func:`_unencodable`, only for what ``write_row`` met). Returned, not raised here: raised
    in this handler, the COPY's end would carry it, and its text, as context."""
    try:
        for row in rows:
            try:
                copy.write_row(row)
            except UnicodeEncodeError:
                return _unencodable(driver, query)
    except Exception as exc:
        return exc
    return None


def _copy_in(driver: psycopg.Connection[Any], query: Query, rows: Rows) -> None:
    """The COPY; an error of ``rows`` ends it with :class:`_RowRefused`'s text (_Refusals)."""
    with _Refusals() as refusals, driver.cursor() as cur, cur.copy(query.text) as copy:
        stopped = _written(driver, copy, query, rows)
        if stopped is not None:
            raise refusals.refuse(stopped)
    refusals.reraise()


def copy_rows(target: SyncTarget, query: Query, rows: Rows) -> bool:
    """COPY ``rows`` with ``query`` (``COPY .. FROM STDIN``); False, having sent nothing, when
    the connection's driver is not psycopg."""
    _check(query)
    if isinstance(target, psycopg.Connection):
        try:
            _copy_in(target, query, rows)
        except psycopg.Error:
            raise  # the connection's state is psycopg's to tell
        except BaseException:
            if _mid_copy(target):
                target.close()
            raise
        return True
    conn = target.connection() if isinstance(target, Session) else target
    if not conn.in_transaction():
        conn.begin()
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        return False
    try:
        _copy_in(driver, query, rows)
    except psycopg.Error as exc:
        if driver.broken:
            conn.invalidate(exc)
        raise _wrap(exc, query, driver.broken) from exc
    except BaseException as exc:
        if _mid_copy(driver):
            conn.invalidate(exc)
        raise
    return True


async def _written_async(
    driver: psycopg.AsyncConnection[Any], copy: AsyncCopy, query: Query, rows: Rows
) -> Exception | None:
    """:func:`_written` for asyncio."""
    try:
        for row in rows:
            try:
                await copy.write_row(row)
            except UnicodeEncodeError:
                return _unencodable(driver, query)
    except Exception as exc:
        return exc
    return None


async def _copy_in_async(driver: psycopg.AsyncConnection[Any], query: Query, rows: Rows) -> None:
    with _Refusals() as refusals:
        async with driver.cursor() as cur, cur.copy(query.text) as copy:
            stopped = await _written_async(driver, copy, query, rows)
            if stopped is not None:
                raise refusals.refuse(stopped)
    refusals.reraise()


async def copy_rows_async(target: AsyncTarget, query: Query, rows: Rows) -> bool:
    """:func:`copy_rows` for async targets."""
    _check(query)
    if isinstance(target, psycopg.AsyncConnection):
        try:
            await _copy_in_async(target, query, rows)
        except psycopg.Error:
            raise  # the connection's state is psycopg's to tell
        except BaseException:
            if _mid_copy(target):
                await target.close()
            raise
        return True
    conn = await target.connection() if isinstance(target, AsyncSession) else target
    if not conn.in_transaction():
        await conn.begin()
    driver = (await conn.get_raw_connection()).driver_connection
    if not isinstance(driver, psycopg.AsyncConnection):
        return False
    try:
        await _copy_in_async(driver, query, rows)
    except psycopg.Error as exc:
        if driver.broken:
            await conn.invalidate(exc)
        raise _wrap(exc, query, driver.broken) from exc
    except BaseException as exc:
        if _mid_copy(driver):
            await conn.invalidate(exc)
        raise
    return True
