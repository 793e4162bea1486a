"""One write at a time on a connection, and wrong targets named (``outbox_conn`` reads the
connection and its key).

A write runs several statements on one connection (a savepoint, the insert, re-reads) and its
results are only true if nothing else runs there meanwhile. Two writes interleaved on one
connection (tasks gathered on one AsyncSession, threads sharing one Session) would nest their
savepoints wrongly, and one's rollback could undo rows the other already reported written; so
a write marks its connection and a second one starting there is refused. The mark is one dict
entry per write in progress (``dict.setdefault`` is atomic: two threads cannot both take it).
"""

from __future__ import annotations

import os
from typing import NoReturn

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
from sqlalchemy.orm import Session, scoped_session

from outboxkit.errors import SharedConnectionError, WrongTargetError

# id() of the driver connection a write is running on -> that write's token. A write takes its
# entry with ``WRITING.setdefault(key, token) is token`` and deletes it when done: inline in
# the writer, two dict operations (about 70 ns) on the single add's hot path.
WRITING: dict[int, object] = {}
# A child forked while a thread wrote would inherit that entry, and a new connection given the
# same id() there would refuse every write: the child starts with none.
os.register_at_fork(after_in_child=WRITING.clear)


def wrong_target(target: object, asynchronous: bool) -> NoReturn:
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
    if isinstance(target, async_scoped_session | scoped_session):
        target = target()  # the current scope's session (Flask-SQLAlchemy's db.session, say)
    if not isinstance(target, kinds):
        wrong_target(target, asynchronous)


def shared_connection() -> SharedConnectionError:
    """Raised when a write finds its connection in :data:`WRITING` under another write."""
    return SharedConnectionError(
        "another outbox write is running on this connection: one Session or Connection"
        " (AsyncSession or AsyncConnection) may serve one thread or task at a time, as"
        " SQLAlchemy requires; interleaved writes could lose rows they reported written."
        " Use a session per task (or await the writes one after another)"
    )
