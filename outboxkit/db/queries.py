"""Every runtime SQL statement, loaded from the named blocks of ``outboxkit/db/sql/*.sql``.

A block starts with ``-- name: <name>``. Parameters are written one way in every file,
``:name`` (as in psql and SQLAlchemy); casts are written ``CAST(:x AS type)``, never ``:x::type``
(the loader refuses it, and the old ``%(x)s`` style, instead of silently sending a wrong
statement). ``{schema}`` is replaced by the quoted schema name, ``{channel}`` by its quoted NOTIFY
channel, and ``{_fragment}`` by a block of the same file whose name starts with ``_``
(written once, e.g. the relay's fencing check).
Whole-line ``--`` comments are dropped: they document the file, not the wire.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, cached_property
from importlib import resources

from outboxkit.schema import notify_channel, quoted

_NAME_RE = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)
_COMMENT_LINE_RE = re.compile(r"^\s*--.*\n?", re.MULTILINE)
# SQLAlchemy's rule (":name" not preceded by ':', a word character or '\'), but a name must end
# where the word ends and not be followed by ':', so ":x::int" is not read as the parameter ":x".
_BIND_RE = re.compile(r"(?<![:\w\\]):(\w+)(?![:\w])")
# Written by mistake, these would reach the server as something else than meant.
_MISTAKES = (
    (re.compile(r"(?<![:\w\\]):\w+::"), "':x::type' (write CAST(:x AS type))"),
    (re.compile(r"%\(\w+\)[sbt]"), "a '%(x)s' placeholder (write :x)"),
)

AREAS = ("outbox", "relay", "inbox", "demo", "session")


@dataclass(frozen=True)
class Query:
    """One named statement for one schema, in each form a driver wants."""

    area: str
    name: str
    text: str  # ``:name`` parameters, as written in the file

    @cached_property
    def psycopg(self) -> bytes:
        """``%(name)s`` placeholders for psycopg (text parameters)."""
        return _BIND_RE.sub(r"%(\1)s", self.text.replace("%", "%%")).encode()

    @cached_property
    def psycopg_binary(self) -> bytes:
        """``%(name)b`` placeholders: arrays of bytes and uuids travel far cheaper in binary."""
        return _BIND_RE.sub(r"%(\1)b", self.text.replace("%", "%%")).encode()

    @cached_property
    def parameters(self) -> frozenset[str]:
        return frozenset(_BIND_RE.findall(self.text))


def _check(area: str, name: str, body: str) -> None:
    for pattern, what in _MISTAKES:
        found = pattern.search(body)
        if found:
            raise ValueError(f"{area}.sql, query {name}: {what} at {found[0]!r}")


@cache
def _raw(area: str) -> dict[str, str]:
    text = resources.files("outboxkit.db").joinpath("sql", f"{area}.sql").read_text()
    parts = _NAME_RE.split(text)
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise ValueError(f"duplicate query name {name!r} in {area}.sql")
        statement = _COMMENT_LINE_RE.sub("", body).strip().rstrip(";").strip()
        _check(area, name, statement)
        blocks[name] = statement
    return blocks


@cache
def queries(area: str, schema: str) -> dict[str, Query]:
    """The statements of one area (``outbox``, ``relay``, ``inbox``, ``demo``) for a schema."""
    schema_sql = quoted(schema)
    raw = _raw(area)
    fragments = {name: body for name, body in raw.items() if name.startswith("_")}
    out = {}
    for name, body in raw.items():
        if name in fragments:
            continue
        for fragment, text in fragments.items():
            body = body.replace("{" + fragment + "}", text)
        body = body.replace("{channel}", '"' + notify_channel(schema) + '"')
        out[name] = Query(area, name, body.replace("{schema}", schema_sql))
    return out


def query(area: str, name: str, schema: str) -> Query:
    return queries(area, schema)[name]
