"""Connections of our own (relay, CLI, consumers' bookkeeping, migrations), and URL forms.

A connection string can carry a password, and libpq quotes the string back in some parse errors
(e.g. a bad ``%`` escape). Every error raised here has the password removed and is raised with no
link to the original exception (which may hold it): not chained, not even as its context.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote, urlsplit

import psycopg
from pydantic import SecretStr

Url = str | SecretStr

_KEYWORD_PASSWORD_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def _plain(url: Url) -> str:
    return url.get_secret_value() if isinstance(url, SecretStr) else url


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


def redact(text: str, url: Url, *passwords: str | None) -> str:
    """``text`` without the password of ``url`` (as written or percent-decoded) nor ``passwords``;
    ``password=...`` of a keyword/value string is masked too."""
    written = _password_of(_plain(url))
    found = (written, unquote(written) if written else None, *passwords)
    for secret in sorted({s for s in found if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return _KEYWORD_PASSWORD_RE.sub(r"\1***", text)


def _redacted(exc: psycopg.Error, url: Url, options: dict[str, Any]) -> psycopg.Error:
    password = options.get("password")
    return type(exc)(redact(str(exc), url, password if isinstance(password, str) else None))


def connect(url: Url, *, autocommit: bool = True, **options: Any) -> psycopg.Connection[Any]:
    """A psycopg connection of our own (autocommit by default: every statement its own tx)."""
    try:
        return psycopg.connect(_plain(url), autocommit=autocommit, **options)
    except psycopg.Error as exc:
        error = _redacted(exc, url, options)
    raise error  # outside the except block: no __context__ holding the original


async def connect_async(
    url: Url, *, autocommit: bool = True, **options: Any
) -> psycopg.AsyncConnection[Any]:
    """:func:`connect` for asyncio."""
    try:
        return await psycopg.AsyncConnection.connect(_plain(url), autocommit=autocommit, **options)
    except psycopg.Error as exc:
        error = _redacted(exc, url, options)
    raise error


def sqlalchemy_url(url: Url, *, driver: str = "psycopg") -> str:
    """libpq URL to the SQLAlchemy form (``postgresql+psycopg://``)."""
    plain = _plain(url)
    scheme, _, rest = plain.partition("://")
    if scheme in ("postgres", "postgresql"):
        return f"postgresql+{driver}://{rest}"
    return plain
