"""Connections of our own (relay, CLI, consumers' bookkeeping), and URL forms.

A connection string can carry a password, and libpq quotes the string back in some parse errors
(e.g. a bad ``%`` escape). Every error raised here has the password removed, and the original
exception (which may hold it) is not chained.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

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


def redact(text: str, url: Url) -> str:
    """``text`` with the password of ``url`` (as written or percent-decoded) replaced by ***."""
    plain = _plain(url)
    password = _password_of(plain)
    if password:
        text = text.replace(password, "***")
    return _KEYWORD_PASSWORD_RE.sub(r"\1***", text)


def _redacted(exc: psycopg.Error, url: Url) -> psycopg.Error:
    cls = type(exc) if isinstance(exc, psycopg.OperationalError) else psycopg.OperationalError
    return cls(redact(str(exc), url))


def connect(url: Url, *, autocommit: bool = True, **options: Any) -> psycopg.Connection[Any]:
    """A psycopg connection of our own (autocommit by default: every statement its own tx)."""
    try:
        return psycopg.connect(_plain(url), autocommit=autocommit, **options)
    except psycopg.Error as exc:
        raise _redacted(exc, url) from None


async def connect_async(
    url: Url, *, autocommit: bool = True, **options: Any
) -> psycopg.AsyncConnection[Any]:
    try:
        return await psycopg.AsyncConnection.connect(_plain(url), autocommit=autocommit, **options)
    except psycopg.Error as exc:
        raise _redacted(exc, url) from None


def sqlalchemy_url(url: Url, *, driver: str = "psycopg") -> str:
    """libpq URL to the SQLAlchemy form (``postgresql+psycopg://``)."""
    plain = _plain(url)
    scheme, _, rest = plain.partition("://")
    if scheme in ("postgres", "postgresql"):
        return f"postgresql+{driver}://{rest}"
    return plain
