"""Transaction control a handler sends as SQL, refused before it is sent.

``session.execute(text("COMMIT"))``, ``exec_driver_sql("ROLLBACK")``, the driver connection's
own ``execute``: each would end the transaction the handlers' writes must commit in, with their
``succeeded`` marks, behind the session's back. In a batch a ROLLBACK lost the earlier handlers'
writes while their events were then marked succeeded (in a new transaction), and a COMMIT made
them durable before their marks, so the batch's rerun applied them again. Savepoints pass.

The check sits in the handler connection's psycopg cursor class (``cursor_factory``), not in a
SQLAlchemy event: any connection event listener puts every statement of the engine on
SQLAlchemy's slower path (about 7 us a statement measured here, the application's own
statements included). The class is set when the handler's connection is taken and taken off
again when the pool gets the connection back.
"""

from __future__ import annotations

import re
import weakref
from typing import Any

import psycopg
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Engine

from outboxkit.errors import HandlerCommitError

_ENDS_TRANSACTION = re.compile(
    r"(?:\s|/\*.*?\*/|--[^\n]*(?:\n|$))*"
    r"(?:COMMIT|END|ABORT|BEGIN|START\s+TRANSACTION|PREPARE\s+TRANSACTION"
    r"|ROLLBACK(?!\s+(?:WORK\s+|TRANSACTION\s+)?TO\b))\b",
    re.IGNORECASE | re.DOTALL,
)
_GUARDED_CLASSES: dict[type[Any], type[Any]] = {}  # a cursor class -> its guarded subclass
_WATCHED: weakref.WeakSet[Engine] = weakref.WeakSet()


def _refuse(query: object) -> None:
    text = query.decode("utf-8", "replace") if isinstance(query, bytes) else query
    if isinstance(text, str) and _ENDS_TRANSACTION.match(text):
        raise HandlerCommitError(
            "a handler must not end its transaction (COMMIT, ROLLBACK, PREPARE TRANSACTION or"
            " the like sent as SQL): its writes commit with the dedup row, after it returns"
        )


def _guarded_class(base: type[Any]) -> type[Any]:
    found = _GUARDED_CLASSES.get(base)
    if found is not None:
        return found
    if issubclass(base, psycopg.AsyncCursor):

        class GuardedAsync(base):  # type: ignore[misc]
            async def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
                _refuse(query)
                return await super().execute(query, *args, **kwargs)

        found = GuardedAsync
    else:

        class Guarded(base):  # type: ignore[misc]
            def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
                _refuse(query)
                return super().execute(query, *args, **kwargs)

        found = Guarded
    _GUARDED_CLASSES[base] = found
    return found


def guard(driver: Any, engine: Engine) -> None:
    """Refuse transaction control sent as SQL on ``driver`` (a psycopg connection) until the
    pool of ``engine`` (a sync engine) gets it back."""
    factory = getattr(driver, "cursor_factory", None)
    if factory is None or factory in _GUARDED_CLASSES.values():
        return
    if engine not in _WATCHED:
        sa_event.listen(engine.pool, "checkin", _unguard)
        _WATCHED.add(engine)
    driver.cursor_factory = _guarded_class(factory)


def _unguard(dbapi_connection: Any, record: Any) -> None:
    driver: Any = getattr(record, "driver_connection", None)
    factory = getattr(driver, "cursor_factory", None)
    if factory is not None and factory in _GUARDED_CLASSES.values():
        driver.cursor_factory = factory.__bases__[0]
