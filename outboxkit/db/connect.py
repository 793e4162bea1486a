"""Connections of our own (relay, CLI, consumers' bookkeeping, migrations). Each asks for the
start-up options of :mod:`outboxkit.db.start_options` (UTF8 text, no prompt), and takes only a URL
:func:`~outboxkit.db.url_checks.checked_url` lets through.

A connection string can carry a password. Every error raised here has the password removed
(:mod:`outboxkit.db.redaction`) and is raised with no link to the original exception (which may
hold it): not chained, not even as its context.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg

from outboxkit.db import own_transaction
from outboxkit.db.abandon import OpenConnections
from outboxkit.db.redaction import HIDDEN, SHORT_SECRET, redact
from outboxkit.db.start_options import NO_PROMPT, start_options
from outboxkit.db.url_checks import INVALID_URL, Url, checked_url, url_problem
from outboxkit.errors import ConfigurationError

__all__ = [
    "HIDDEN",
    "INVALID_URL",
    "SHORT_SECRET",
    "Url",
    "checked_url",
    "connect",
    "connect_async",
    "connection_async",
    "redact",
    "refused",
    "url_problem",
]

_INSUFFICIENT_PRIVILEGE = "42501"


def refused(exc: psycopg.ProgrammingError, url: Url) -> ConfigurationError:
    """A ``ProgrammingError`` of a start-up check as one line, which waiting cannot fix. With no
    SQLSTATE libpq refused the URL itself (a malformed string); with one, the server refused a
    statement (a role without its grants, say), which is no fault of the URL."""
    lines = redact(str(exc).strip(), url).splitlines()
    problem = lines[0] if lines else type(exc).__name__
    if exc.sqlstate is None:
        return ConfigurationError(f"{INVALID_URL}: {problem}")
    hint = " (outboxkit migrate grants prints the grants a role needs)"
    return ConfigurationError(
        f"PostgreSQL refused a start-up query: {problem} (SQLSTATE {exc.sqlstate})"
        + (hint if exc.sqlstate == _INSUFFICIENT_PRIVILEGE else "")
    )


def _redacted(exc: psycopg.Error, url: Url, options: dict[str, Any]) -> psycopg.Error:
    password = options.get("password")
    text = redact(str(exc), url, password if isinstance(password, str) else None)
    if HIDDEN in text and exc.sqlstate:
        text += f" (SQLSTATE {exc.sqlstate})"
    if options.get("sslpassword") == NO_PROMPT and _KEY_NOT_LOADED in text:
        text += "" if any(c in text.lower() for c in _NOT_THE_PASSWORD) else _KEY_HINT
    return type(exc)(text)


_KEY_NOT_LOADED = "could not load private key file"
_KEY_HINT = (
    " (the URL gives no sslpassword: an encrypted key needs its pass phrase as sslpassword,"
    " percent-encoded in a URL)"
)
_NOT_THE_PASSWORD = ("key values mismatch", "unsupported", "no such file", "permission denied")


def _options(url: Url, options: dict[str, Any]) -> dict[str, Any]:
    return {**start_options(url), **options}


def _unreadable(exc: ValueError) -> ConfigurationError:
    """psycopg's error decoding the string (a byte that is not UTF-8) quotes a byte of it and
    its place: only the class is told."""
    return ConfigurationError(
        f"{INVALID_URL}: psycopg cannot read it ({type(exc).__name__}; its text is not shown)"
    )


def connect(
    url: Url, *, autocommit: bool = True, track: OpenConnections | None = None, **options: Any
) -> psycopg.Connection[Any]:
    """A psycopg connection of our own (autocommit by default: every statement its own tx);
    ``track``: where a stopping process finds it (:mod:`outboxkit.db.abandon`). Its statements
    run at READ COMMITTED whatever the server's default (:mod:`outboxkit.db.own_transaction`):
    ours rely on each statement seeing what committed before it."""
    plain = checked_url(url)
    options = _options(url, options)
    error: Exception
    try:
        if track is not None:
            track.check_new()
        conn = psycopg.connect(plain, autocommit=autocommit, **options)
        conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
        if track is not None:
            track.track(conn)
        own_transaction.read_default(conn)
        return conn
    except psycopg.Error as exc:
        error = _redacted(exc, url, options)
    except ValueError as exc:
        error = _unreadable(exc)
    raise error  # outside the except block: no __context__ holding the original


async def connect_async(
    url: Url, *, autocommit: bool = True, track: OpenConnections | None = None, **options: Any
) -> psycopg.AsyncConnection[Any]:
    """:func:`connect` for asyncio."""
    plain = checked_url(url)
    options = _options(url, options)
    error: Exception
    try:
        if track is not None:
            track.check_new()
        conn = await psycopg.AsyncConnection.connect(plain, autocommit=autocommit, **options)
        await conn.set_isolation_level(psycopg.IsolationLevel.READ_COMMITTED)
        if track is not None:
            track.track(conn)
        await own_transaction.read_default_async(conn)
        return conn
    except psycopg.Error as exc:
        error = _redacted(exc, url, options)
    except ValueError as exc:
        error = _unreadable(exc)
    raise error


@contextlib.asynccontextmanager
async def connection_async(
    url: Url, *, autocommit: bool = True, track: OpenConnections | None = None, **options: Any
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """:func:`connect_async` for an ``async with`` block that closes the connection whatever
    ends it. psycopg's own ``async with`` first commits or rolls back, an await: a task cancelled
    there (a shutdown cancels a task that is already unwinding) skips the close and leaves the
    connection open until the garbage collector finds it. ``close()`` never waits, so nothing
    can interrupt it; an open transaction ends with the connection (rolled back)."""
    conn = await connect_async(url, autocommit=autocommit, track=track, **options)
    try:
        yield conn
    finally:
        await conn.close()
