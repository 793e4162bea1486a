"""A statement that is its own transaction: at READ COMMITTED, and run again if it lost a race.

Our own connections are in autocommit mode, so each statement is its own transaction, at the
session's default isolation level. A database may default to a stricter one (``ALTER DATABASE
.. SET default_transaction_isolation = 'serializable'``, as a shop that wants it for its
application sets). Our statements are written for READ COMMITTED; run as serializable they fail
now and then with serialization failures (40001), which the relay answered by ending its term (a
new producer, reconciliation, seconds without publishing), and they take part in the database's
conflict checks, so they also made the application's own serializable transactions fail. Only
a session ``SET`` could change the default, and behind a transaction pooler that ``SET`` would
stay on the server connection for other clients. So a connection of ours whose default is
another level (read once, when it is opened) runs each statement sent on its own inside an
explicit READ COMMITTED transaction (psycopg's ``BEGIN`` says the level): two round trips more,
only there.

A statement on its own that lost a race anyway (a deadlock, 40P01, at any level) rolled back
whole, so it runs again: running it again is running it for the first time. A statement inside
a caller's transaction never runs again here: that transaction is aborted, and it is its
owner's to retry.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus

from outboxkit.db.queries import query
from outboxkit.schema import DEFAULT_SCHEMA

logger = logging.getLogger("outboxkit.db")
T = TypeVar("T")

READ_COMMITTED = "read committed"
LOST_RACE = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
# The pause before each new run (times 0.5-1.5, so racers part); one more loss is the caller's.
PAUSES = (0.0, 0.01, 0.05)

_STRICTER: weakref.WeakSet[Any] = weakref.WeakSet()  # our connections with a stricter default
_DEFAULT_LEVEL = query("session", "default_isolation", DEFAULT_SCHEMA)


def _note(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], row: Any) -> None:
    if row is None or row[0] != READ_COMMITTED:
        _STRICTER.add(conn)


def read_default(conn: psycopg.Connection[Any]) -> None:
    """Read a new connection's default level (one round trip); a failure closes it."""
    try:
        _note(conn, conn.execute(_DEFAULT_LEVEL.psycopg).fetchone())
    except BaseException:
        conn.close()
        raise


async def read_default_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`read_default` for asyncio."""
    try:
        _note(conn, await (await conn.execute(_DEFAULT_LEVEL.psycopg)).fetchone())
    except BaseException:
        await conn.close()
        raise


def alone(driver: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when a statement sent now is its own transaction."""
    return driver.autocommit and driver.info.transaction_status == TransactionStatus.IDLE


def _lost(exc: psycopg.Error, pause: float) -> float:
    logger.debug("a statement lost a race (%s); running it again", exc.sqlstate)
    return pause * (0.5 + random.random())


def run_alone(driver: psycopg.Connection[Any], fetch: Callable[[], T]) -> T:
    """``fetch()``, a statement sent on its own (see :func:`alone`), as the module says."""

    def attempt() -> T:
        if driver not in _STRICTER:
            return fetch()
        with driver.transaction():
            return fetch()

    for pause in PAUSES:
        try:
            return attempt()
        except LOST_RACE as exc:
            time.sleep(_lost(exc, pause))
    return attempt()


async def run_alone_async(
    driver: psycopg.AsyncConnection[Any], fetch: Callable[[], Awaitable[T]]
) -> T:
    """:func:`run_alone` for asyncio."""

    async def attempt() -> T:
        if driver not in _STRICTER:
            return await fetch()
        async with driver.transaction():
            return await fetch()

    for pause in PAUSES:
        try:
            return await attempt()
        except LOST_RACE as exc:
            await asyncio.sleep(_lost(exc, pause))
    return await attempt()
