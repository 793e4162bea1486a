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

_GAP = r"(?:\s|/\*.*?\*/|--[^\n]*(?:\n|$))"  # whitespace and comments between tokens
_KEYWORD = (
    r"(?:COMMIT|END|ABORT|BEGIN|START\s+TRANSACTION|PREPARE\s+TRANSACTION"
    rf"|ROLLBACK(?!{_GAP}+(?:(?:WORK|TRANSACTION){_GAP}+)?TO\b))\b"
)
_ENDS_TRANSACTION = re.compile(rf"{_GAP}*{_KEYWORD}", re.IGNORECASE | re.DOTALL)
# A query without parameters goes by the simple protocol, which runs several statements: one
# after a ";" counts too (a ";" inside a string literal followed by such a word is refused
# as well: rare, and only without parameters).
_ENDS_LATER = re.compile(rf";{_GAP}*{_KEYWORD}", re.IGNORECASE | re.DOTALL)


# Verdicts by statement text, with and without parameters: a handler sends the same few texts
# (SQLAlchemy hands over one cached string per compiled statement), and in a running consumer
# the two regular expressions cost 2.4 us a statement against well under 1 us for the lookup.
# Bounded: texts that never repeat (values written into the SQL) only refill it. Only plain
# str and bytes are remembered: a subclass could compare equal to a text it is not.
_VERDICTS: tuple[dict[object, bool], dict[object, bool]] = ({}, {})  # [with, without] params
_VERDICTS_MAX = 1024


def _refuse(query: object, params: object, cursor: Any) -> None:
    verdicts = _VERDICTS[not params]
    plain = type(query) is str or type(query) is bytes
    ends = verdicts.get(query) if plain else None
    if ends is None:
        ends = _judge(query, params, cursor)
        if plain:
            if len(verdicts) >= _VERDICTS_MAX:
                verdicts.clear()
            verdicts[query] = ends
    if ends:
        raise HandlerCommitError(
            "a handler must not end its transaction (COMMIT, ROLLBACK, PREPARE TRANSACTION or"
            " the like sent as SQL): its writes commit with the dedup row, after it returns"
        )


def _judge(query: object, params: object, cursor: Any) -> bool:
    if not isinstance(query, str | bytes) and hasattr(query, "as_string"):  # a psycopg sql object
        query = query.as_string(cursor.connection)
    text = query.decode("utf-8", "replace") if isinstance(query, bytes) else query
    if not isinstance(text, str):
        return False
    return bool(_ENDS_TRANSACTION.match(text) or (not params and _ENDS_LATER.search(text)))


def _base(factory: Any) -> type[Any] | None:
    """The cursor class a guarded one was made from (None: not a guarded class)."""
    return getattr(factory, _BASE, None)


_BASE = "_outboxkit_unguarded"
# A cursor class -> its guarded subclass (two threads may each make one: both are marked)
_GUARDED_CLASSES: dict[type[Any], type[Any]] = {}
_WATCHED: weakref.WeakSet[Engine] = weakref.WeakSet()


def _guarded_class(base: type[Any]) -> type[Any]:
    found = _GUARDED_CLASSES.get(base)
    if found is not None:
        return found
    if issubclass(base, psycopg.AsyncCursor):

        class GuardedAsync(base):  # type: ignore[misc]
            async def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
                _refuse(query, params, self)
                return await super().execute(query, params, **kw)

            async def executemany(self, query: Any, params_seq: Any, **kw: Any) -> Any:
                _refuse(query, None, self)
                return await super().executemany(query, params_seq, **kw)

            def stream(self, query: Any, params: Any = None, **kw: Any) -> Any:
                _refuse(query, params, self)
                return super().stream(query, params, **kw)

        found = GuardedAsync
    else:

        class Guarded(base):  # type: ignore[misc]
            def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
                _refuse(query, params, self)
                return super().execute(query, params, **kw)

            def executemany(self, query: Any, params_seq: Any, **kw: Any) -> Any:
                _refuse(query, None, self)
                return super().executemany(query, params_seq, **kw)

            def stream(self, query: Any, params: Any = None, **kw: Any) -> Any:
                _refuse(query, params, self)
                return super().stream(query, params, **kw)

        found = Guarded
    setattr(found, _BASE, base)  # recognised (and undone) whichever thread made it
    _GUARDED_CLASSES[base] = found
    return found


def guard(driver: Any, engine: Engine) -> None:
    """Refuse transaction control sent as SQL on ``driver`` (a psycopg connection) until the
    pool of ``engine`` (a sync engine) gets it back."""
    factory = getattr(driver, "cursor_factory", None)
    if factory is None or _base(factory) is not None:
        return
    if engine not in _WATCHED:
        sa_event.listen(engine.pool, "checkin", _unguard)
        _WATCHED.add(engine)
    driver.cursor_factory = _guarded_class(factory)


def _unguard(dbapi_connection: Any, record: Any) -> None:
    driver: Any = getattr(record, "driver_connection", None)
    base = _base(getattr(driver, "cursor_factory", None))
    if base is not None:
        driver.cursor_factory = base
