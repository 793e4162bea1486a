"""Hostile input kept out of SQL, logs and headers: header checks, safe ids, bounded excerpts,
and exception text without bound parameters.

Header values become primary-key columns: a NUL byte or a value past PostgreSQL's index row
limit (~2.7 KB) fails the claim *and* the rejection insert, so they are checked before any SQL.
A refused value is recorded under ``sha256:<hex>`` of its raw bytes: stable (a redelivery maps
to the same id) and harmless to store and print.
"""

from __future__ import annotations

import hashlib
import inspect
import re

import psycopg

from outboxkit.db.availability import with_pooler_hint
from outboxkit.errors import DecodeError, detail_of, named
from outboxkit.wire import HEADER_EVENT_ID, HEADER_LIMITS, header_problem

EXCERPT_CHARS = 200  # how much attacker-controlled text a stored reason may quote
REASON_CHARS = 1000  # the cap of a stored reason / error text

# Where a data exception's message starts quoting a value: a quote, ``: ``, a byte dump.
_VALUE_START = re.compile(r'"|: |\b0x[0-9a-fA-F]')
_QUOTE = re.compile('"')
# SQLSTATE classes whose first line quotes only what the schema or the server names (a
# constraint, a relation, a column): connection, integrity, transaction state, rollback,
# resources, object state, operator intervention, system errors. Any other class may quote a
# statement's value (``CAST(:v AS regclass)``: relation "<v>"; ``current_setting(:v)``).
_NAMES_ONLY = ("08", "23", "25", "40", "53", "55", "57", "58")


class InvalidHeaderError(DecodeError):
    """A header value that cannot be stored safely."""

    def __init__(self, message: str, *, safe_event_id: str | None) -> None:
        super().__init__(message)
        self.safe_event_id = safe_event_id


def hashed(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def escape(text: str) -> str:
    """Non-printable characters (NUL, ESC, newlines, ...) as ``\\x..`` escapes."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """The first ``limit`` characters of ``text``, escaped, with how much was cut."""
    cut = len(text) - limit
    shown = escape(text[:limit])
    return shown if cut <= 0 else f"{shown}...(+{cut} chars)"


def bounded(text: str, limit: int = REASON_CHARS) -> str:
    """A reason or error text fit to store and print: escaped and capped."""
    return excerpt(text, limit)


def event_id_problem(event_id: str) -> str | None:
    """Why an event id given by an operator or an application is one the consumer would refuse
    in the event-id header (the same check), or ``None``. The reason never quotes the id."""
    if not event_id:
        return "empty"
    raw = event_id.encode("utf-8", errors="surrogatepass")
    return header_problem(raw, HEADER_LIMITS[HEADER_EVENT_ID])


def check_headers(raw_headers: tuple[tuple[str, bytes | None], ...]) -> None:
    """Raise :class:`InvalidHeaderError` for the first identity header that is unsafe.

    The last occurrence of a header counts (as in ``headers_to_dict``).
    """
    last: dict[str, bytes] = {}
    for name, value in raw_headers:
        if name in HEADER_LIMITS and value is not None:
            last[name] = value
    problems = {n: header_problem(v, HEADER_LIMITS[n]) for n, v in last.items()}
    bad = [(n, p) for n, p in problems.items() if p is not None]
    if not bad:
        return
    raw_id = last.get(HEADER_EVENT_ID)
    if raw_id is None:
        safe_id = None
    elif problems.get(HEADER_EVENT_ID) is None:
        safe_id = raw_id.decode("utf-8")
    else:
        safe_id = hashed(raw_id)
    name, problem = bad[0]
    raise InvalidHeaderError(
        f"header {name!r} refused: {problem}; value {excerpt(repr(last[name]), 80)}",
        safe_event_id=safe_id,
    )


def error_text(exc: BaseException, *, detail: bool = False) -> str:
    """``Class: message`` of an exception, without bound SQL parameters unless ``detail``.

    SQLAlchemy's text ends with ``[parameters: ...]`` and the driver's DETAIL lines quote row
    values, so a database error is reported by the driver's class, SQLSTATE and first message
    line; a data exception (SQLSTATE class 22) is cut where it starts quoting (a ``"``, ``: ``
    or ``0x``): its values may hold a ``"`` or a newline, be lower-cased or dumped as bytes, so
    no quote pair can be trusted to enclose them. Other classes are cut at their first ``"``,
    except those whose quotes name schema objects (a unique violation keeps its constraint's
    name) when the quotes pair up. A statement's error without a SQLSTATE (raised binding a value,
    or by the driver itself) is reported by its classes alone.

    Never raises: it settles a handler's failure, and an error here would send that record down
    the unexpected-error path (no retry policy, no dead letter). A handler's exception whose
    ``str()`` (or an attribute read here) raises is described by :func:`_unprintable`.
    """
    try:
        return _error_text(exc, detail)
    except KeyboardInterrupt:  # a Ctrl-C that came meanwhile is a stop, not the text
        raise
    except BaseException as failure:  # a handler's str() may raise anything, SystemExit too
        try:
            return _unprintable(exc, failure, detail)
        except Exception:  # not even its class's name can be read
            return "unprintable exception"


def message(exc: BaseException) -> str:
    """``str(exc)``, or :func:`error_text` of an exception whose ``str()`` raises (a handler may
    raise its own subclass of one of ours)."""
    try:
        return str(exc)
    except KeyboardInterrupt:
        raise
    except BaseException:  # a handler's str() may raise anything, SystemExit too
        return error_text(exc)


def _error_text(exc: BaseException, detail: bool) -> str:
    if detail:
        return bounded(with_pooler_hint(named(exc), exc), 4000)
    orig = getattr(exc, "orig", None)
    if hasattr(exc, "statement") and hasattr(exc, "params"):
        # A server's error (with a SQLSTATE) and the driver's own (a lost connection) quote
        # no bound value in their first line; what failed while binding in Python (an Enum's
        # LookupError, a type's TypeError) may quote one, so it is named by its type alone.
        if not isinstance(orig, BaseException):
            return f"{type(exc).__name__}: statement failed (details hidden)"
        if getattr(orig, "sqlstate", None) is None and not isinstance(orig, psycopg.Error):
            names = f"{type(exc).__name__} ({type(orig).__name__})"
            return f"{names}: statement failed (details hidden)"
    if isinstance(orig, BaseException):
        exc = orig
    sqlstate = getattr(exc, "sqlstate", None)
    lines = detail_of(exc).strip().splitlines()  # a Kafka client's error names its class too
    first = lines[0] if lines else ""
    if sqlstate is None:
        return bounded(f"{type(exc).__name__}: {first}")
    data_exception = str(sqlstate).startswith("22")
    if not str(sqlstate).startswith(_NAMES_ONLY) or first.count('"') % 2:
        cut = (_VALUE_START if data_exception else _QUOTE).search(first)
        if cut is not None:
            first = f"{first[: cut.start()].rstrip()} (value hidden)".lstrip()
    return bounded(with_pooler_hint(f"{type(exc).__name__} (SQLSTATE {sqlstate}): {first}", exc))


def _unprintable(exc: BaseException, failure: BaseException, detail: bool) -> str:
    """``Class: message (str() raised Error)``, quoting the first line of the message the
    exception was built with only if that is plain text and, unless ``detail``, the exception
    is no database error (whose message may quote row values). Calls none of its methods."""
    message = ""
    args = BaseException.__dict__["args"].__get__(exc)  # not an ``args`` the class redefined
    if args and type(args[0]) is str and (detail or not _from_database(exc)):
        lines = args[0].strip().splitlines()
        message = f": {lines[0]}" if lines else ""
    return bounded(f"{type(exc).__name__}{message} (str() raised {type(failure).__name__})")


def _from_database(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a SQLAlchemy or driver error (read without its properties)."""
    return any(
        inspect.getattr_static(exc, name, None) is not None
        for name in ("orig", "statement", "params", "sqlstate")
    )
