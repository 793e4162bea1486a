"""Every runtime SQL statement, loaded from the named blocks of ``outboxkit/sql/*.sql``.

A block starts with ``-- name: <name>``; ``{schema}`` in the text is replaced by the quoted
schema name. No SQL is written inline in the runtime modules.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from outboxkit.migrator import validate_schema_name

_NAME_RE = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


@cache
def _raw(area: str) -> dict[str, str]:
    text = resources.files("outboxkit").joinpath("sql", f"{area}.sql").read_text()
    parts = _NAME_RE.split(text)
    blocks: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in blocks:
            raise ValueError(f"duplicate query name {name!r} in {area}.sql")
        blocks[name] = body.strip().rstrip(";")
    return blocks


@cache
def queries(area: str, schema: str) -> dict[str, str]:
    """The queries of one area (``outbox``, ``relay``, ``inbox``) for a given schema.

    A block whose name starts with ``_`` is a fragment: it is written once and inserted wherever
    another block of the same area says ``{_name}`` (e.g. the relay's fencing check).
    """
    quoted = '"' + validate_schema_name(schema) + '"'
    raw = _raw(area)
    fragments = {name: body for name, body in raw.items() if name.startswith("_")}
    out = {}
    for name, body in raw.items():
        if name in fragments:
            continue
        for fragment, text in fragments.items():
            body = body.replace("{" + fragment + "}", text)
        out[name] = body.replace("{schema}", quoted)
    return out


def query(area: str, name: str, schema: str) -> str:
    return queries(area, schema)[name]
