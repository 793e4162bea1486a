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

A statement on its own that lost a race anyway (a deadlock, 40P01, at any level; a
serialization failure, 40001, on a connection that is not ours, such as the consumer's
bookkeeping on an AUTOCOMMIT connection of your engine) rolled back whole, so it runs again, up
to three times: running it again is running it for the first time (a sequence value it took
stays a gap). A statement inside a transaction never runs again here: that transaction is
aborted, and it is its owner's to retry.
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
# Per async connection of ours with a stricter default: one statement's own transaction at a time.
_UNITS: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()
_DEFAULT_LEVEL = query("session", "default_isolation", DEFAULT_SCHEMA)


def _note(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], row: Any) -> None:
    if row is None or row[0] != READ_COMMITTED:
        _STRICTER.add(conn)


def read_default(conn: psycopg.Connection[Any]) -> None:
    """Read a new autocommit connection's default level (one round trip; a connection in
    transactions has its level in each BEGIN already); a failure closes it."""
    if not conn.autocommit:
        return
    try:
        _note(conn, conn.execute(_DEFAULT_LEVEL.psycopg).fetchone())
    except BaseException:
        conn.close()
        raise


async def read_default_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`read_default` for asyncio."""
    if not conn.autocommit:
        return
    try:
        _note(conn, await (await conn.execute(_DEFAULT_LEVEL.psycopg)).fetchone())
    except BaseException:
        await conn.close()
        raise
    if conn in _STRICTER:
        _UNITS[conn] = asyncio.Lock()


def _alone(driver: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """True when a statement sent now is its own transaction."""
    return driver.autocommit and driver.info.transaction_status == TransactionStatus.IDLE


def _lost(exc: psycopg.Error, pause: float) -> float:
    logger.debug("a statement lost a race (%s); running it again", exc.sqlstate)
    return pause * (0.5 + random.random())


def _again_if_lost(attempt: Callable[[], T]) -> T:
    for pause in PAUSES:
        try:
            return attempt()
        except LOST_RACE as exc:
            time.sleep(_lost(exc, pause))
    return attempt()


async def _again_if_lost_async(attempt: Callable[[], Awaitable[T]]) -> T:
    for pause in PAUSES:
        try:
            return await attempt()
        except LOST_RACE as exc:
            await asyncio.sleep(_lost(exc, pause))
    return await attempt()


def run(driver: psycopg.Connection[Any], fetch: Callable[[], T]) -> T:
    """``fetch()``, a statement on ``driver``, as the module says. (Our sync connections are
    each used by one thread at a time.)"""
    if not _alone(driver):
        return fetch()
    if driver not in _STRICTER:
        return _again_if_lost(fetch)

    def in_transaction() -> T:
        with driver.transaction():
            return fetch()

    return _again_if_lost(in_transaction)


async def run_async(driver: psycopg.AsyncConnection[Any], fetch: Callable[[], Awaitable[T]]) -> T:
    """:func:`run` for asyncio. On a connection with a stricter default, a statement's
    BEGIN..COMMIT is one unit: another task's statement on the connection waits for it instead
    of running inside it (the relay's park and its previous batch's mark share one)."""
    unit = _UNITS.get(driver)
    if unit is None:
        return await (_again_if_lost_async(fetch) if _alone(driver) else fetch())

    async def in_transaction() -> T:
        async with driver.transaction():
            return await fetch()

    async with unit:
        return await (_again_if_lost_async(in_transaction) if _alone(driver) else fetch())
