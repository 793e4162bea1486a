"""Least-privilege GRANT statements (``db/sql/grants.sql``) for the application, relay and
consumer roles, with the REVOKEs that narrow what earlier versions granted: re-running them on
an existing deployment converges on exactly these privileges.

Role names are identifiers chosen by an operator: they are quoted by ``psycopg.sql`` (never
pasted as text), so a name like ``app"; DROP TABLE x; --`` is one odd role name, not SQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import sql

from outboxkit.db.execute import one
from outboxkit.db.queries import queries
from outboxkit.errors import ConfigurationError

ROLES = ("app", "relay", "consumer")


def check_role_name(kind: str, name: str) -> None:
    """Refuse a name GRANT does not read as one role, quoted or not (PostgreSQL 15): ``public``
    is the PUBLIC pseudo-role (every role would get the rights), ``none`` is refused by the
    server, and a ``pg_`` name, which no one may create, is a predefined role (every member of
    ``pg_read_all_data``, say). A quoted ``current_user`` is a role of that name: let through."""
    if name in ("public", "none"):
        why = "PUBLIC, every role" if name == "public" else "reserved by PostgreSQL"
        raise ConfigurationError(f"--{kind} {name}: GRANT reads this name as {why}")
    if name.startswith("pg_"):
        raise ConfigurationError(
            f"--{kind} {name}: names starting with pg_ are PostgreSQL's predefined roles,"
            " whose every member would get the rights"
        )


def statements(schema: str, roles: Mapping[str, str]) -> list[sql.Composed]:
    """The statements for each named role (keys among :data:`ROLES`), in that order."""
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown role kind(s) {sorted(unknown)}; known: {list(ROLES)}")
    for kind, given in roles.items():
        if given:
            check_role_name(kind, given)
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
    """The grants as a script (``;`` terminated lines) for a DBA or ``psql``: one transaction,
    so a writer never sees the moment between a REVOKE and the narrower GRANT after it."""
    body = "".join(f"{s.as_string(conn)};\n" for s in statements(schema, roles))
    return f"BEGIN;\n{body}COMMIT;\n"


def apply(conn: psycopg.Connection[Any], schema: str, roles: Mapping[str, str]) -> int:
    """Run the grants in one transaction (as the schema owner; see :func:`render`); how many
    statements ran."""
    done = statements(schema, roles)
    with conn.transaction(), conn.cursor() as cur:
        for statement in done:
            cur.execute(statement)
    return len(done)


def app_may_set_state(conn: psycopg.Connection[Any], schema: str, role: str) -> bool:
    """Whether ``role`` may still INSERT the outbox's ``state`` after :func:`apply`: privileges
    it holds through PUBLIC, another role or ownership survive the REVOKE, and with them it
    could store a parked row."""
    found = one(conn, queries("grants", schema)["app_may_set_state"], {"role": role})
    return bool(found and found[0])
