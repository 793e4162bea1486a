"""An index as PostgreSQL holds it, for the migrations' index tests."""

from __future__ import annotations

import psycopg


def index_of(url: str, schema: str, name: str) -> tuple[int, str, bool] | None:
    """Oid, definition (without the schema) and validity of the schema's index ``name``."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT c.oid::int,"
            " replace(pg_get_indexdef(c.oid), ' ON ' || quote_ident(n.nspname) || '.', ' ON '),"
            " i.indisvalid"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s",
            (schema, name),
        ).fetchone()
    return None if row is None else (int(row[0]), str(row[1]), bool(row[2]))
