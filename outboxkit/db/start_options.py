"""The start-up options every connection of ours sends (and every engine of ours passes on).

``client_encoding=UTF8``: a database or role can default to another encoding (``ALTER DATABASE
.. SET client_encoding = 'LATIN1'``, or ``PGCLIENTENCODING`` in the environment), and the server
then refuses to send a row holding a character that encoding lacks. A relay's claim failed on
such a row every time, and the shard stalled behind it; outboxkit must read every character any
writer stored.

``sslpassword``: see :data:`NO_PROMPT`.

``connect_timeout``: :data:`~outboxkit.db.abandon.CONNECT_TIMEOUT_SECONDS` unless the URL or
``PGCONNECT_TIMEOUT`` gives one: a server that accepts the TCP connection and never answers
(frozen, or behind a partition) held every command without one for ever.
"""

from __future__ import annotations

import os

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr

from outboxkit.db.abandon import connect_timeout

#: Given as ``sslpassword`` when the URL gives none: libpq then lets OpenSSL ask the terminal for
#: an encrypted client key's pass phrase, which blocks the process (a relay's event loop, lease
#: renewals and all) until someone types, or, with no terminal, fails as a bare "processing error".
#: OpenSSL reads it only to decrypt a key: an unencrypted one never uses it.
NO_PROMPT = "outboxkit-no-sslpassword-given"
_SSLPASSWORD_LIBPQ = 130000  # libpq 13 added sslpassword
#: The one encoding that carries every character a row can hold.
CLIENT_ENCODING = "UTF8"


def prompt_free(url: str | SecretStr) -> dict[str, str]:
    """The connection options that keep libpq from prompting for a key's pass phrase."""
    plain = url.get_secret_value() if isinstance(url, SecretStr) else url
    try:
        params = conninfo_to_dict(plain)
    except (psycopg.Error, ValueError, TypeError):  # the connection attempt reports it
        return {}
    if params.get("sslpassword") or params.get("service") or os.environ.get("PGSERVICE"):
        return {}  # a service file may give it: an option of ours would override it
    if psycopg.pq.version() < _SSLPASSWORD_LIBPQ:
        return {}  # an option it does not know would fail every connection
    return {"sslpassword": NO_PROMPT}


def start_options(url: str | SecretStr) -> dict[str, str]:
    """Every option above, for ``url``; the caller's own options go on top."""
    return {"client_encoding": CLIENT_ENCODING, **prompt_free(url), **connect_timeout(url)}
