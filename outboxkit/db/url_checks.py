"""The shapes of a database URL libpq, urllib and SQLAlchemy all read alike, checked before a
URL is used or shown (:func:`checked_url`), and the reason for a refusal, which quotes nothing.

A URL whose password holds an unencoded ``@``, ``/``, ``?`` or ``#`` is refused: libpq splits the
user info at the first ``@``, urllib (our redaction) at the last and SQLAlchemy by its own
pattern, so a piece of the password would reach an error message as a "host" or "port", where no
redaction can recognise it. So is a NUL character (libpq reads the URL up to it: the rest is lost,
a password may become a host) and a percent-escape in a query parameter's name (libpq decodes it:
``pass%77ord`` is the password, which no mask of the written text would find), and a ``%`` escape
libpq or psycopg refuses (not two hex digits, ``%00``, bytes that are not UTF-8): their errors
quote the value as written, or a byte of it. A string that is neither a ``scheme://`` URL nor
keyword/value pairs (a URL without its ``//``, or behind a byte-order mark) is refused too:
libpq's error would quote it whole, and nothing in a string of no known shape tells where its
password is.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

from psycopg.pq import Conninfo
from pydantic import SecretStr

from outboxkit.errors import ConfigurationError

Url = str | SecretStr

_SPACES = " \t\n\r\f\v"  # what libpq skips between keyword/value pairs (not Unicode spaces)
SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
INVALID_URL = "the database URL is invalid"
_ENCODE = "percent-encode '@', ':', '/', '?' and '#' in the user name and password"
_NUL = "a NUL character"
_ESCAPED_KEY = "a percent-escape in a query parameter name"
_NOT_UTF8 = "a character that is not UTF-8"
BAD_ESCAPE = "a '%' not followed by two hex digits"
NUL_ESCAPE = "a '%00' escape (a NUL character)"
NOT_UTF8_ESCAPE = "percent-escapes that do not decode as UTF-8"
_BOM = "a byte-order mark (U+FEFF) at its start"
_NOT_A_PAIR = "a query parameter that is not one name=value pair"
_UNKNOWN_KEYWORD = "a parameter name libpq does not know"
#: What libpq reads, as keywords and URL query parameters (``ssl=true``: JDBC's spelling).
_LIBPQ_KEYWORDS = frozenset(option.keyword.decode() for option in Conninfo.get_defaults())
_URI_KEYWORDS = _LIBPQ_KEYWORDS | {"ssl"}
_NOT_A_URL = "neither a scheme://... URL nor key=value pairs"
_HINTS = {
    _NUL: "remove it",
    _ESCAPED_KEY: "write parameter names as plain text",
    _NOT_UTF8: "remove it",
    BAD_ESCAPE: "write a '%' as %25",
    NUL_ESCAPE: "remove it",
    NOT_UTF8_ESCAPE: "percent-encode the UTF-8 bytes of each character",
    _BOM: "save the file or variable without it (not as 'UTF-8 with BOM')",
    _NOT_A_PAIR: "percent-encode '&' and '=' in a value (%26, %3D)",
    _UNKNOWN_KEYWORD: "check the names' spelling, and quote a value holding spaces",
    _NOT_A_URL: "write postgresql://user:password@host:port/dbname, or key=value pairs with"
    " a value holding spaces in single quotes",
}
_BAD_ESCAPE_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def url_text(url: Url) -> str:
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
    differently, or why libpq could not read it at all, or None. A string without a
    ``scheme://`` must be keyword/value pairs. The reason never quotes the URL."""
    if "\x00" in url:
        return _NUL
    if not _encodable(url):  # e.g. a variable's byte that is not UTF-8: psycopg quotes its place
        return _NOT_UTF8
    scheme, sep, rest = url.partition("://")
    if not sep or not SCHEME_RE.fullmatch(scheme):
        return _keyword_problem(url)
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
    params = query.split("&") if query else []
    if any("%" in param.partition("=")[0] for param in params):
        return _ESCAPED_KEY
    if any(param.count("=") != 1 for param in params):  # libpq quotes the piece: a password's
        return _NOT_A_PAIR
    if any(param.partition("=")[0] not in _URI_KEYWORDS for param in params):
        return _UNKNOWN_KEYWORD  # libpq quotes the name, which may be a password's tail
    return _port_problem(hosts) or _escape_problem(rest)


def _keyword_problem(text: str) -> str | None:
    """Why ``text``, not a ``scheme://`` URL, is no keyword/value string either, or None.
    libpq would quote the whole string in its error (``missing "=" after "..."``), password and
    all, and no mask could find the password in a string of no known shape."""
    if text.startswith("\ufeff"):
        return _BOM
    keywords = _keywords(text)
    if keywords is None:
        return _NOT_A_URL
    if not keywords <= _LIBPQ_KEYWORDS:  # libpq quotes the name: ``password=a b=c`` gives "b"
        return _UNKNOWN_KEYWORD
    return None


def _keywords(text: str) -> set[str] | None:
    """The keywords libpq reads in ``text`` as keyword/value pairs (its parser, step by step),
    or None if it cannot read it."""
    i, end = 0, len(text)
    found: set[str] = set()
    while True:
        while i < end and text[i] in _SPACES:
            i += 1
        if i >= end:  # past it: a backslash ended the last value
            return found
        start = i
        while i < end and text[i] != "=" and text[i] not in _SPACES:
            i += 1
        found.add(text[start:i])
        keyword = i > start
        while i < end and text[i] in _SPACES:
            i += 1
        if not keyword or i == end or text[i] != "=":  # no keyword, or no '=' after it
            return None
        i += 1
        while i < end and text[i] in _SPACES:
            i += 1
        quoted = i < end and text[i] == "'"
        i += quoted
        stops = "'" if quoted else _SPACES
        while i < end and text[i] not in stops:
            i += 2 if text[i] == "\\" else 1
        if quoted:
            if i >= end:  # never closed
                return None
            i += 1


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
        return BAD_ESCAPE
    if "%00" in rest:
        return NUL_ESCAPE
    try:
        unquote_to_bytes(rest).decode("utf-8")
    except UnicodeDecodeError:
        return NOT_UTF8_ESCAPE
    return None


def checked_url(url: Url) -> str:
    """The URL's text, or a :class:`ConfigurationError` (one line, quoting nothing) when its
    parts could be read differently: every connection of ours, and ``config show``, go here."""
    plain = url_text(url)
    problem = url_problem(plain)
    if problem is not None:
        raise ConfigurationError(f"{INVALID_URL} ({problem}): {_HINTS.get(problem, _ENCODE)}")
    return plain
