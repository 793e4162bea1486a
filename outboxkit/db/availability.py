"""Is an error the database's state, rather than something wrong with the work?

A consumer counts failures against the record it was processing and gives the record up after a
few; an outage must not count, or a valid record is given up when PostgreSQL returns between two
attempts. The database's state, whatever the record: a connection that failed (no SQLSTATE, or
class 08), a server shutting down, starting up or dropping the database (57P01-57P05), too many
connections (53300), an invalidated connection, a pool timeout; and a server that answers but
takes no writes: read-only (25006: a replica, or ``default_transaction_read_only``) or out of
disk space (53100); and a busy one: a statement timed out or cancelled (57014: a
``statement_timeout`` an overloaded server runs into), a lock not available in time (55P03), a
deadlock or a serialization failure (40P01, 40001); and a pooler that lost a prepared statement
(26000, 42P05: below). Everything else (a value refused, a value
too large for an index, a constraint, an I/O error, which may be one bad block's, a bug, out of
memory) is the record's.

Two finer questions for the consumer (:func:`not_the_records`, :func:`interrupted`): on the
middleware's own statements, which carry nothing of a record's size, a privilege refused (42501)
is an operator's grant and any shortage of resources (class 53) the server's, not the record;
and in the handler's transaction only an ended session is the database's, unless the run's own
wait ended it.
"""

from __future__ import annotations

import psycopg
import sqlalchemy as sa

# psycopg prepares a statement it has run 5 times on a connection. A pooler that gives each
# transaction whichever server connection is free (PgBouncer in transaction mode before 1.21,
# or with max_prepared_statements = 0) then runs it where it was never prepared ("prepared
# statement ... does not exist", 26000), or prepares a second one of the same name where
# another client's is ("... already exists", 42P05). A setting's fault, never a record's.
PREPARED_STATEMENT_LOST = frozenset({"26000", "42P05"})
POOLER_HINT = (
    "a connection pooler that does not keep prepared statements (PgBouncer in transaction"
    " mode before 1.21, or max_prepared_statements = 0)? Set [database] prepared_statements"
    " = false (OUTBOXKIT_DATABASE_PREPARED_STATEMENTS=false), and create your own engines"
    " with connect_args={'prepare_threshold': None}"
)

# Answered by a server in a state no record brought about, whatever the error's class.
_SERVER_STATES = (
    frozenset({"25006", "53100", "53300", "57P01", "57P02", "57P03", "57P04", "57P05"})
    | {"57014", "55P03", "40P01", "40001"}  # busy: retried, as a transaction that lost a race
    | PREPARED_STATEMENT_LOST
)


# A missing grant: the same statement fails for every record until an operator grants it back.
PRIVILEGE_REFUSED = "42501"
GRANT_HINT = (
    "a privilege on outboxkit's tables is missing: `outboxkit migrate grants --consumer <role>`"
    " prints what the consumer's role needs"
)
# The session ended, or could not begin, whatever statement ran: no run can bring these about.
_SESSION_ENDED = frozenset({"53300", "57P01", "57P02", "57P03", "57P04", "57P05"})
# ... except the end of a session its own transaction waited too long in: the run's own doing
# (idle_in_transaction_session_timeout, transaction_timeout), counted as the handler's failure.
_WAITED_TOO_LONG = frozenset({"25P03", "25P04"})


def _driver_error(exc: BaseException) -> psycopg.Error | None:
    """The psycopg error, bare or wrapped by SQLAlchemy."""
    orig = getattr(exc, "orig", None)
    driver = orig if isinstance(orig, BaseException) else exc
    return driver if isinstance(driver, psycopg.Error) else None


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg error, bare or wrapped by SQLAlchemy."""
    driver = _driver_error(exc)
    sqlstate = None if driver is None else driver.sqlstate
    return None if sqlstate is None else str(sqlstate)


def with_pooler_hint(text: str, exc: BaseException) -> str:
    """``text``, with :data:`POOLER_HINT` when ``exc`` is a prepared statement a pooler lost."""
    if sqlstate_of(exc) in PREPARED_STATEMENT_LOST and POOLER_HINT not in text:
        return f"{text} ({POOLER_HINT})"
    return text


def database_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the database could not be reached, went away, or takes no
    writes."""
    if getattr(exc, "connection_invalidated", False) or isinstance(exc, sa.exc.TimeoutError):
        return True
    driver = _driver_error(exc)
    if driver is None:
        return False
    sqlstate = sqlstate_of(driver)
    if sqlstate is None:
        # libpq failed before the server answered: refused, reset, timed out
        return isinstance(driver, psycopg.OperationalError | psycopg.InterfaceError)
    return str(sqlstate).startswith("08") or sqlstate in _SERVER_STATES


def privilege_refused(exc: BaseException) -> bool:
    """True when ``exc`` is a privilege the server refused (SQLSTATE 42501)."""
    return sqlstate_of(exc) == PRIVILEGE_REFUSED


def grant_hint(exc: BaseException) -> str:
    """What to append to the text of ``exc``: :data:`GRANT_HINT` for a refused privilege."""
    return f" ({GRANT_HINT})" if privilege_refused(exc) else ""


def not_the_records(exc: BaseException) -> bool:
    """True when ``exc``, raised by one of the consumer middleware's own statements, is no
    fault of the record: the database away (:func:`database_unavailable`), a grant missing, or
    the server short of a resource (class 53: its lock table full, "out of shared memory";
    ``temp_file_limit``; memory): those statements carry nothing of a record's size. Before, a
    full lock table had each record given up after ``max_unexpected_errors``. Only for its own
    statements: a handler's refused privilege, or its statement out of memory, is the
    application's."""
    sqlstate = sqlstate_of(exc)
    if sqlstate is not None and sqlstate.startswith("53"):
        return True
    return database_unavailable(exc) or privilege_refused(exc)


def interrupted(exc: BaseException, *, own_statement: bool) -> bool:
    """True when a handler's run failed for no fault of its record, so it is not an attempt:
    its ``succeeded`` mark (``own_statement``) failed as :func:`not_the_records` says; or,
    raised from the handler or at the commit (which runs the handler's deferred work too), its
    connection was lost (SQLAlchemy invalidated it, as a batch checks), the server ended the
    session, or the pool had no connection for it. Never for a session the run's own wait
    ended: that handler would run for ever, never counted."""
    sqlstate = sqlstate_of(exc)
    if sqlstate in _WAITED_TOO_LONG:
        return False
    if own_statement:
        return not_the_records(exc)
    if getattr(exc, "connection_invalidated", False) or isinstance(exc, sa.exc.TimeoutError):
        return True
    return sqlstate is not None and (sqlstate.startswith("08") or sqlstate in _SESSION_ENDED)
