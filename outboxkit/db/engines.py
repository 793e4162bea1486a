"""The SQLAlchemy engines outboxkit's own processes make (``inbox run``, the ``inbox`` commands,
``outboxkit verify``'s writers, the demo), made in one place.

Each one gets what our own psycopg connections get (:func:`~outboxkit.db.connect.connect`): the
URL checked and turned into SQLAlchemy's form without quoting it in an error, and the start-up
options of :mod:`~outboxkit.db.start_options` (UTF8 text whatever the database's default; no
prompt for an encrypted client key's pass phrase, which blocks the process until someone types).
And a pooled connection the server ended while it sat idle is replaced at
checkout instead of failing the first statement after a quiet spell (:func:`ended_while_idle`).
An application's own engine stays the application's to make.
"""

from __future__ import annotations

import select
from typing import TYPE_CHECKING, Any

from outboxkit.db.abandon import OpenConnections
from outboxkit.db.connect import INVALID_URL, Url, checked_url
from outboxkit.db.start_options import start_options
from outboxkit.errors import ConfigurationError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine


def sqlalchemy_url(url: Url, *, driver: str = "psycopg") -> str:
    """libpq URL to the SQLAlchemy form (``postgresql+psycopg://``); one SQLAlchemy cannot
    parse is a :class:`ConfigurationError` here, not its own error quoting the text."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    plain = checked_url(url)
    scheme, _, rest = plain.partition("://")
    if scheme in ("postgres", "postgresql"):
        plain = f"postgresql+{driver}://{rest}"
    try:
        make_url(plain)
        return plain
    except (ArgumentError, ValueError, TypeError):  # e.g. a keyword/value string, two hosts
        pass
    raise ConfigurationError(  # outside the except block: no context holding the text
        f"{INVALID_URL}: SQLAlchemy cannot parse it (a postgresql:// URL is needed, with one"
        " host; its text is not shown)"
    )


def engine_options(url: Url, connect_args: dict[str, Any] | None) -> dict[str, Any]:
    """The ``connect_args`` an engine of ours passes psycopg: the caller's ``connect_args``
    win; the start options win over the URL, a service file and the environment (UTF8 text
    even where one of them names another encoding)."""
    return {**start_options(url), **(connect_args or {})}


def sync_engine(
    url: Url,
    *,
    connect_args: dict[str, Any] | None = None,
    track: OpenConnections | None = None,
    **options: Any,
) -> Engine:
    """A SQLAlchemy engine over psycopg for ``url`` (a libpq URL); ``options`` go to
    :func:`sqlalchemy.create_engine` (pool size and the like); ``track``: where a stopping
    process finds the engine's connections (:mod:`outboxkit.db.abandon`)."""
    from sqlalchemy import create_engine

    engine = create_engine(
        sqlalchemy_url(url), connect_args=engine_options(url, connect_args), **options
    )
    _replace_ended(engine)
    if track is not None:
        _track_pool(engine, track)
    return engine


def async_engine(
    url: Url,
    *,
    connect_args: dict[str, Any] | None = None,
    track: OpenConnections | None = None,
    **options: Any,
) -> AsyncEngine:
    """:func:`sync_engine` for asyncio."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(
        sqlalchemy_url(url), connect_args=engine_options(url, connect_args), **options
    )
    _replace_ended(engine.sync_engine)
    if track is not None:
        _track_pool(engine.sync_engine, track)
    return engine


def _track_pool(engine: Engine, track: OpenConnections) -> None:
    """Every connection the engine's pool opens, tracked (psycopg's own, not the adapter), and
    none opened once the process refuses new ones."""
    from sqlalchemy import event

    def opening(*_: Any) -> None:
        track.check_new()

    def opened(_: Any, record: Any) -> None:
        track.track(record.driver_connection)

    event.listen(engine, "do_connect", opening)
    event.listen(engine, "connect", opened)


def ended_while_idle(conn: Any) -> bool:
    """Whether the server ended ``conn`` (a psycopg connection, sync or async) while it sat
    idle: an idle connection has nothing to read unless the server said goodbye (an
    ``idle_session_timeout``, a restart, a terminated backend) or hung up. No I/O: a
    zero-timeout poll of its socket, a few µs on a busy consumer's every checkout, where a ping
    would cost a round trip each. A connection a middlebox dropped without a word is not seen.
    Something else to read (a NOTIFY on a pooled connection that ran LISTEN) also counts:
    replaced, it costs one connect."""
    try:
        fd = conn.pgconn.socket
    except Exception:  # closed, or broken already
        return True
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


_POOLED = "outboxkit.pooled"  # in a connection record's info: back in the pool since last used


def _replace_ended(engine: Engine) -> None:
    """A pooled connection :func:`ended_while_idle` is replaced at checkout (SQLAlchemy opens
    another in its place): the first statement after a quiet spell would otherwise fail on it,
    failing a consumer's batch, logging it and running its records again one by one. Only a
    connection that went back to the pool is looked at: one opened for this checkout is handed
    out as it is (SQLAlchemy tries twice, then fails with an error that says nothing of the
    database), and its first statement tells."""
    from sqlalchemy import event, exc

    def checkin(_dbapi: Any, record: Any) -> None:
        record.info[_POOLED] = True

    def checkout(_dbapi: Any, record: Any, _proxy: Any) -> None:
        if record.info.pop(_POOLED, False) and ended_while_idle(record.driver_connection):
            raise exc.DisconnectionError("ended by the server while idle in the pool")

    event.listen(engine, "checkin", checkin)
    event.listen(engine, "checkout", checkout)
