"""Connections of our own (relay, CLI, consumers' bookkeeping, migrations), and URL forms. Each
asks for the start-up options of :mod:`outboxkit.db.start_options` (UTF8 text, no prompt).

A connection string can carry a password, and libpq quotes the string back in some parse errors
(e.g. a bad ``%`` escape). Every error raised here has the password removed and is raised with no
link to the original exception (which may hold it): not chained, not even as its context.

A URL whose password holds an unencoded ``@``, ``/``, ``?`` or ``#`` is refused before it is
used (:func:`checked_url`): libpq splits the user info at the first ``@``, urllib (our redaction) at
the last and SQLAlchemy by its own pattern, so a piece of the password would reach an error
message as a "host" or "port", where no redaction can recognise it. So is a NUL character (libpq
reads the URL up to it: the rest is lost, a password may become a host) and a percent-escape in
a query parameter's name (libpq decodes it: ``pass%77ord`` is the password, which no mask of the
written text would find), and a ``%`` escape libpq or psycopg refuses (not two hex digits, ``%00``,
bytes that are not UTF-8): their errors quote the value as written, or a byte of it.

Masking a password that also matches other text gives it away (``inbo***_rejection``, ``user
"***"``): :func:`redact` then hides the whole message instead.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote, unquote_to_bytes, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr

from outboxkit.db import own_transaction
from outboxkit.db.abandon import OpenConnections
from outboxkit.db.start_options import NO_PROMPT, start_options
from outboxkit.errors import ConfigurationError

Url = str | SecretStr

_KEYWORD_PASSWORD_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
INVALID_URL = "the database URL is invalid"
_ENCODE = "percent-encode '@', ':', '/', '?' and '#' in the user name and password"
_NUL = "a NUL character"
_ESCAPED_KEY = "a percent-escape in a query parameter name"
_NOT_UTF8 = "a character that is not UTF-8"
_BAD_ESCAPE = "a '%' not followed by two hex digits"
_NUL_ESCAPE = "a '%00' escape (a NUL character)"
_NOT_UTF8_ESCAPE = "percent-escapes that do not decode as UTF-8"
_HINTS = {
    _NUL: "remove it",
    _ESCAPED_KEY: "write parameter names as plain text",
    _NOT_UTF8: "remove it",
    _BAD_ESCAPE: "write a '%' as %25",
    _NUL_ESCAPE: "remove it",
    _NOT_UTF8_ESCAPE: "percent-encode the UTF-8 bytes of each character",
}
_BAD_ESCAPE_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")
#: A secret shorter than this (the least NIST SP 800-63B allows for a password) is likely to match
#: ordinary text of a message (a word, a table or user name): a message holding it is hidden.
SHORT_SECRET = 8
HIDDEN = (
    "message hidden: masking the password in it could give part of the password away (a"
    f" password of {SHORT_SECRET} or more characters, found nowhere else in the URL, avoids this)"
)
_LEAD_RE = re.compile(r"[A-Za-z_][\w.]*: ")  # a "Class: " the caller put first
#: Fixed phrases of libpq's and the server's errors, kept when a message is hidden (unless a
#: secret is in one): an operator still tells a refused login from an unreachable server.
KNOWN_FAILURES = (
    "password authentication failed",
    "no password supplied",
    "no pg_hba.conf entry",
    "permission denied",
    "does not exist",
    "too many connections",
    "connection refused",
    "could not translate host name",
    "timeout expired",
    "server closed the connection unexpectedly",
    "SSL",
)
_INSUFFICIENT_PRIVILEGE = "42501"
#: The libpq parameters whose values are secrets.
_SECRET_KEYS = ("password", "sslpassword")


def _plain(url: Url) -> str:
    return url.get_secret_value() if isinstance(url, SecretStr) else url


def _port_problem(hosts: str) -> str | None:
    for host in hosts.partition("?")[0].split(","):
        port = host.rpartition("]")[2] if host.startswith("[") else host
        digits = port.partition(":")[2]
        if digits and not (digits.isascii() and digits.isdigit()):
            return "a port that is not a number"
    return None


def url_problem(url: str) -> str | None:
    """Why libpq, urllib and SQLAlchemy could split ``url``'s user info, host and port
    differently, or None (a keyword/value string has none). The reason never quotes the URL."""
    if "\x00" in url:
        return _NUL
    if not _encodable(url):  # e.g. a variable's byte that is not UTF-8: psycopg quotes its place
        return _NOT_UTF8
    scheme, sep, rest = url.partition("://")
    if not sep or not _SCHEME_RE.fullmatch(scheme):
        return None
    head, _, after = rest.partition("/")  # libpq looks for the '@' up to the first '/'
    if "#" in head:  # a fragment to urllib, text to libpq
        return "a '#' before the database name"
    userinfo, at, hosts = head.partition("@")
    if not at:
        hosts = head
    elif "@" in hosts:
        return "more than one '@' before the database name"
    elif "?" in userinfo:
        return "a '?' before the '@'"
    if "@" in after:  # e.g. a '/' in the password ended the host early (%40 in a path is fine)
        return "an '@' after the first '/'"
    query = rest.partition("?")[2]  # a '?' before the '@' was refused above
    if any("%" in param.partition("=")[0] for param in query.split("&")):
        return _ESCAPED_KEY
    return _port_problem(hosts) or _escape_problem(rest)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _escape_problem(rest: str) -> str | None:
    """Why libpq (or psycopg, decoding what libpq decoded) would refuse a ``%`` escape of a URL,
    quoting the value as written (or naming a byte of it), or None."""
    if _BAD_ESCAPE_RE.search(rest):
        return _BAD_ESCAPE
    if "%00" in rest:
        return _NUL_ESCAPE
    try:
        unquote_to_bytes(rest).decode("utf-8")
    except UnicodeDecodeError:
        return _NOT_UTF8_ESCAPE
    return None


def checked_url(url: Url) -> str:
    """The URL's text, or a :class:`ConfigurationError` (one line, quoting nothing) when its
    parts could be read differently: every connection of ours, and ``config show``, go here."""
    plain = _plain(url)
    problem = url_problem(plain)
    if problem is not None:
        raise ConfigurationError(f"{INVALID_URL} ({problem}): {_HINTS.get(problem, _ENCODE)}")
    return plain


def _password_of(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    if parts is not None and parts.password:
        return parts.password
    netloc = url.partition("://")[2].partition("/")[0]
    userinfo, at, _ = netloc.rpartition("@")
    if at and ":" in userinfo:
        return userinfo.partition(":")[2]
    return None


def _secrets_read(url: str) -> list[str]:
    """The values libpq reads as a password or key password, however spelled (the user info,
    a query parameter, a keyword), also read by hand from the query of a URL libpq refuses
    (an unknown parameter beside it, say), whose error may still quote them."""
    query = url.partition("://")[2].partition("?")[2]
    pairs = (param.partition("=") for param in query.split("&"))
    # As written too: libpq's parse error quotes a value with a bad escape as written.
    found = [x for k, _, v in pairs if unquote(k) in _SECRET_KEYS for x in (v, unquote(v))]
    try:
        params = conninfo_to_dict(url)
    except (psycopg.Error, ValueError, TypeError):  # its text may quote the string: dropped
        return found
    return found + [str(params[key]) for key in _SECRET_KEYS if params.get(key)]


def redact(text: str, url: Url, *passwords: str | None) -> str:
    """``text`` without the password of ``url`` (as written or percent-decoded), the values
    libpq reads as ``password``/``sslpassword``, nor ``passwords``; ``password=...`` (and
    ``sslpassword=...``) as written in a query or keyword/value string is masked too.

    The URL itself, where ``text`` quotes it, keeps all but its password values. Elsewhere a
    secret is masked only where it can be nothing else: a whole word, at least
    :data:`SHORT_SECRET` long, found nowhere else in the URL (the user name, say). Otherwise
    the mask would tell what the password matches, so the message is :data:`HIDDEN` (a leading
    ``Class: `` and the :data:`KNOWN_FAILURES` it names are kept)."""
    plain = _plain(url)
    written = _password_of(plain)
    found = (written, unquote(written) if written else None, *_secrets_read(plain), *passwords)
    secrets = sorted({s for s in found if s}, key=len, reverse=True)
    shown = _shown_url(plain)
    pieces = text.split(plain) if shown is not None and plain else [text]
    others = shown if shown is not None else _without(plain, secrets)
    masked = [_masked(piece, secrets, others) for piece in pieces]
    if any(piece is None for piece in masked):
        lead = _LEAD_RE.match(text)
        kept = lead.group(0) if lead else ""
        return (kept if _masked(kept, secrets, "") == kept else "") + HIDDEN + _said(text, secrets)
    return (shown or "").join(piece or "" for piece in masked)


def _said(text: str, secrets: list[str]) -> str:
    """``; it says: <phrases>`` for the :data:`KNOWN_FAILURES` in ``text`` outside the secrets
    (a phrase found only inside the password would tell part of it) that share no text with
    one."""
    for secret in secrets:
        text = re.sub(re.escape(secret), "\x00", text, flags=re.IGNORECASE)
    folded = text.casefold()
    said = [
        phrase
        for phrase in KNOWN_FAILURES
        if phrase.casefold() in folded
        and not any(
            s.casefold() in phrase.casefold() or phrase.casefold() in s.casefold() for s in secrets
        )
    ]
    return f"; it says: {', '.join(said)}" if said else ""


def _without(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "\x00")
    return text


def _masked(text: str, secrets: list[str], others: str) -> str | None:
    """``text`` with ``password=...`` and each secret masked, or None where a mask could point
    at what a secret is (see :func:`redact`)."""
    text = _KEYWORD_PASSWORD_RE.sub(r"\1***", text)
    for secret in secrets:
        hits = len(re.findall(re.escape(secret), text, re.IGNORECASE))
        if not hits:
            continue
        word = re.compile(rf"(?<!\w){re.escape(secret)}(?!\w)", re.IGNORECASE)
        if len(secret) < SHORT_SECRET or secret.casefold() in others.casefold():
            return None
        text, words = word.subn("***", text)
        if words != hits:  # part of a longer word: ``inbo***_rejection``
            return None
    return text


def _shown_url(plain: str) -> str | None:
    """``plain`` with only its password values masked (user info, query, keywords), or None
    when its parts could be read differently (:func:`url_problem`: it is never shown then)."""
    if url_problem(plain) not in (None, _BAD_ESCAPE, _NUL_ESCAPE, _NOT_UTF8_ESCAPE):
        return None
    scheme, sep, rest = plain.partition("://")
    if not sep or not _SCHEME_RE.fullmatch(scheme):
        return _KEYWORD_PASSWORD_RE.sub(r"\1***", plain)
    userinfo, at, hosts = rest.partition("@")  # the one '@', before any '/' or '?'
    if at and ":" in userinfo:
        rest = f"{userinfo.partition(':')[0]}:***@{hosts}"
    base, mark, query = rest.partition("?")
    params = (param.partition("=") for param in query.split("&"))
    query = "&".join(
        k + eq + ("***" if eq and unquote(k) in _SECRET_KEYS else v) for k, eq, v in params
    )
    return f"{scheme}://{base}{mark}{query}"


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
