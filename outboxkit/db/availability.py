"""Is an error the database being away, rather than something wrong with the work?

A consumer counts failures against the record it was processing and gives the record up after a
few; an outage must not count, or a valid record is given up when PostgreSQL returns between two
attempts. Connection failures (no SQLSTATE, or class 08), server shutdowns (57P01-57P03),
too many connections (53300), an invalidated connection and a pool timeout are the database's
state; everything else (a value refused, a constraint, a bug) is the record's.
"""

from __future__ import annotations

import psycopg
import sqlalchemy as sa

_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})


def database_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` says the database could not be reached or went away."""
    if getattr(exc, "connection_invalidated", False) or isinstance(exc, sa.exc.TimeoutError):
        return True
    orig = getattr(exc, "orig", None)
    driver = orig if isinstance(orig, BaseException) else exc
    if not isinstance(driver, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    sqlstate = getattr(driver, "sqlstate", None)
    if sqlstate is None:
        return True  # libpq failed before the server answered: refused, reset, timed out
    return str(sqlstate).startswith("08") or sqlstate in _UNAVAILABLE_STATES
