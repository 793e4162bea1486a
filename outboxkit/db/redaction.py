"""Passwords taken out of text: libpq quotes a connection string back in some parse errors (e.g.
a bad ``%`` escape), the server names the user, and psycopg's errors may hold the whole string.

Masking a password that also matches other text gives it away (``inbo***_rejection``, ``user
"***"``, ``password *** failed``): :func:`redact` then hides the whole message instead.
"""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from outboxkit.db.url_checks import (
    BAD_ESCAPE,
    NOT_UTF8_ESCAPE,
    NUL_ESCAPE,
    SCHEME_RE,
    Url,
    url_problem,
    url_text,
)

#: The libpq parameters whose values are secrets.
_SECRET_KEYS = (
    "password",
    "sslpassword",
    "oauth_client_secret",
    "scram_client_key",
    "scram_server_key",
)
#: A secret keyword, ``=`` and its value as libpq reads it: quoted (masked to the end if it never
#: closes), or up to the next space, a backslash taking the next character as it is (``a\\ b`` is
#: ``a b``).
_KEYWORD_PASSWORD_RE = re.compile(
    rf"((?:{'|'.join(_SECRET_KEYS)})"
    r"[ \t\n\r\f\v]*=[ \t\n\r\f\v]*)"
    r"('(?:[^'\\]|\\[\s\S])*'|'[\s\S]*|(?:[^\\ \t\n\r\f\v]|\\[\s\S]|\\$)+)",
    re.IGNORECASE,
)
#: Letters only (or words joined by ``-``, ``_``, ``.``, ``'``): such a secret may be a word of
#: libpq's or the server's own text, which a mask in its place would point at.
_WORDS_RE = re.compile(r"[^\W\d_]+(?:[-_.'][^\W\d_]+)*")
#: A secret shorter than this (the least NIST SP 800-63B allows for a password) is likely to match
#: ordinary text of a message (a word, a table or user name): a message holding it is hidden.
SHORT_SECRET = 8
HIDDEN = (
    "message hidden: masking the password in it could give part of the password away (a"
    f" password of {SHORT_SECRET} or more characters, not letters alone, found nowhere else in the"
    " URL, avoids this)"
)
#: In place of a URL quoted in a message that cannot be shown (:func:`url_problem`).
NOT_SHOWN = "(the database URL, not shown)"
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

    The URL itself, where ``text`` quotes it, keeps all but its password values (one that
    :func:`url_problem` refuses is :data:`NOT_SHOWN` there). Elsewhere a
    secret is masked only where it can be nothing else: a whole word, at least
    :data:`SHORT_SECRET` long, not made of letters alone (``authentication`` is a word of
    libpq's own text), found nowhere else in the URL (the user name, say). Otherwise
    the mask would tell what the password matches, so the message is :data:`HIDDEN` (a leading
    ``Class: `` and the :data:`KNOWN_FAILURES` it names are kept)."""
    plain = url_text(url)
    written = _password_of(plain)
    found = (written, unquote(written) if written else None, *_secrets_read(plain), *passwords)
    secrets = sorted({s for s in found if s}, key=len, reverse=True)
    shown = _shown_url(plain)
    pieces = text.split(plain) if plain else [text]
    others = shown if shown is not None else _without(plain, secrets)
    masked = [_masked(piece, secrets, others) for piece in pieces]
    if any(piece is None for piece in masked):
        lead = _LEAD_RE.match(text)
        kept = lead.group(0) if lead else ""
        return (kept if _masked(kept, secrets, "") == kept else "") + HIDDEN + _said(text, secrets)
    return (NOT_SHOWN if shown is None else shown).join(piece or "" for piece in masked)


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
        if (
            len(secret) < SHORT_SECRET
            or _WORDS_RE.fullmatch(secret)  # "password *** failed": a word of the message
            or secret.casefold() in others.casefold()
        ):
            return None
        text, words = word.subn("***", text)
        if words != hits:  # part of a longer word: ``inbo***_rejection``
            return None
    return text


def _shown_url(plain: str) -> str | None:
    """``plain`` with only its password values masked (user info, query, keywords), or None
    when its parts could be read differently (:func:`url_problem`: it is never shown then)."""
    if url_problem(plain) not in (None, BAD_ESCAPE, NUL_ESCAPE, NOT_UTF8_ESCAPE):
        return None
    scheme, sep, rest = plain.partition("://")
    if not sep or not SCHEME_RE.fullmatch(scheme):
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
