"""Run the outboxkit migrations from your own Alembic revision, and keep autogenerate off them.

In a revision::

    from outboxkit import alembic_ops

    def upgrade() -> None:
        alembic_ops.upgrade(op)             # applies whatever outboxkit migrations are pending

In ``env.py``::

    context.configure(..., include_object=alembic_ops.include_object)

The migrations run on Alembic's connection, inside Alembic's transaction, under the same
advisory lock as ``outboxkit migrate up``. outboxkit migrations are forward-only, so there is no
``downgrade``. The session's ``search_path`` is restored afterwards, so your own operations in
the same revision are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from outboxkit import migrator
from outboxkit.errors import ConfigurationError
from outboxkit.migrator import DEFAULT_SCHEMA
from outboxkit.tables import metadata_for


def upgrade(op: Any, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Apply pending outboxkit migrations on the revision's connection; returns their versions."""
    context = op.get_context()
    if getattr(context, "as_sql", False):
        raise ConfigurationError(
            "outboxkit migrations cannot run in Alembic's offline (--sql) mode;"
            " use `outboxkit migrate sql` for the SQL"
        )
    dbapi = op.get_bind().connection.dbapi_connection
    if not isinstance(dbapi, psycopg.Connection):
        raise ConfigurationError(
            "outboxkit's Alembic helper needs the psycopg (3) driver: postgresql+psycopg://"
        )
    with dbapi.cursor() as cur:
        cur.execute("SELECT current_setting('search_path')")
        row = cur.fetchone()
        search_path = row[0] if row else "public"
        applied = migrator.upgrade(dbapi, schema)
        cur.execute("SELECT set_config('search_path', %s, false)", (search_path,))
    return applied


def is_outboxkit_table(name: str | None, schema: str | None, outboxkit_schema: str) -> bool:
    return schema == outboxkit_schema and f"{schema}.{name}" in metadata_for(schema).tables


def include_object_for(
    schema: str = DEFAULT_SCHEMA,
    include: bool = False,
    chain: Callable[..., bool] | None = None,
) -> Callable[[Any, str | None, str, bool, Any], bool]:
    """An ``include_object`` that leaves outboxkit's tables (and their indexes, columns, ...)
    out of autogenerate (or keeps *only* them, with ``include=True``); ``chain`` is your own
    filter, consulted for everything else."""

    def include_object(
        obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
    ) -> bool:
        table = obj if type_ == "table" else getattr(obj, "table", None)
        if table is not None:
            ours = is_outboxkit_table(table.name, table.schema, schema)
        else:
            ours = getattr(obj, "schema", None) == schema
        if ours:
            return include
        if include:
            return False
        return chain(obj, name, type_, reflected, compare_to) if chain else True

    return include_object


#: Leaves the default ``outboxkit`` schema's tables out of autogenerate.
include_object = include_object_for()


def include_name(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
    """For ``include_schemas=True``: do not reflect the ``outboxkit`` schema at all."""
    return not (type_ == "schema" and name == DEFAULT_SCHEMA)
