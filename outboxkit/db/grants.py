"""Least-privilege GRANT statements (``db/sql/grants.sql``) for the application, relay and
consumer roles.

Role names are identifiers chosen by an operator: they are quoted by ``psycopg.sql`` (never
pasted as text), so a name like ``app"; DROP TABLE x; --`` is one odd role name, not SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from outboxkit.db.queries import queries

ROLES = ("app", "relay", "consumer")


def statements(schema: str, roles: Mapping[str, str]) -> list[sql.Composed]:
    """The grants for each named role (keys among :data:`ROLES`), in that order."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown role kind(s) {sorted(unknown)}; known: {list(ROLES)}")
    blocks = queries("grants", schema)
    out: list[sql.Composed] = []
    for kind in ROLES:
        name = roles.get(kind)
        if not name:
            continue
        for line in blocks[kind].text.split(";"):
            if line.strip():
                out.append(sql.SQL(line.strip()).format(role=sql.Identifier(name)))
    return out


def render(
    schema: str, roles: Mapping[str, str], conn: psycopg.Connection[Any] | None = None
) -> str:
    """The grants as a script (``;`` terminated lines) for a DBA or ``psql``."""
    return "".join(f"{s.as_string(conn)};\n" for s in statements(schema, roles))


def apply(conn: psycopg.Connection[Any], schema: str, roles: Mapping[str, str]) -> int:
    """Run the grants in one transaction (as the schema owner); how many statements ran."""
    done = statements(schema, roles)
    with conn.transaction(), conn.cursor() as cur:
        for statement in done:
            cur.execute(statement)
    return len(done)
