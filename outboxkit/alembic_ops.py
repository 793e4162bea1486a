"""Run the outboxkit migrations from your own Alembic revision, and keep autogenerate off them.

In a revision::

    from outboxkit import alembic_ops

    def upgrade() -> None:
        alembic_ops.upgrade(op)             # applies whatever outboxkit migrations are pending

In ``env.py``, leave outboxkit's schema out of autogenerate (its tables are made by its own SQL
migrations, not by your models)::

    context.configure(..., include_schemas=True, include_name=alembic_ops.include_name)
    # or, filtering objects rather than reflection:
    context.configure(..., include_object=alembic_ops.include_object)
    # another schema name, chained with your own filter:
    context.configure(..., include_object=alembic_ops.include_object_for("billing_outbox",
                                                                          chain=my_filter))

outboxkit keeps every table in its own schema, so "ours" simply means "in that schema".
The migrations run on Alembic's connection, inside Alembic's transaction, under the same
advisory lock as ``outboxkit migrate up``. They are forward-only, so there is no ``downgrade``.
The session's ``search_path`` is put back afterwards, so your own operations in the same
revision are unaffected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from sqlalchemy.dialects.postgresql import base as pg_base
from sqlalchemy.types import UserDefinedType

from outboxkit.db import migrator
from outboxkit.errors import ConfigurationError
from outboxkit.schema import DEFAULT_SCHEMA, validate_schema_name

IncludeObject = Callable[[Any, str | None, str, bool, Any], bool]


class Xid8(UserDefinedType[str]):
    """PostgreSQL's 64-bit transaction id (``outbox_message.xact_id``)."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "XID8"


# ``include_object`` filters after reflection: without this, reflecting outboxkit's schema warns
# about an unknown type (an error under ``-W error``). Registered only when this module is used.
pg_base.ischema_names.setdefault("xid8", Xid8)


def upgrade(op: Any, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Apply pending outboxkit migrations on the revision's connection; returns their versions."""
    context = op.get_context()
    if getattr(context, "as_sql", False):
        raise ConfigurationError(
            "outboxkit migrations cannot run in Alembic's offline (--sql) mode;"
            " use `outboxkit migrate sql` for the SQL"
        )
    bind = op.get_bind()
    dbapi = bind.connection.dbapi_connection
    if not isinstance(dbapi, psycopg.Connection):
        raise ConfigurationError(
            "outboxkit's Alembic helper needs the psycopg (3) driver: postgresql+psycopg://"
        )
    # The revision's transaction (per migration, or for the whole run) may not have sent its
    # first statement yet: the migrations join it rather than commit on their own.
    return migrator.upgrade(dbapi, schema, joined=bind.in_transaction())


def _schema_of(obj: Any, type_: str) -> str | None:
    """The schema of a table, or of the table an index, column or constraint belongs to."""
    table = obj if type_ == "table" else getattr(obj, "table", None)
    found = getattr(table if table is not None else obj, "schema", None)
    return found if isinstance(found, str) else None


def include_object_for(
    schema: str = DEFAULT_SCHEMA,
    include: bool = False,
    chain: IncludeObject | None = None,
) -> IncludeObject:
    """An ``include_object`` that leaves everything in outboxkit's schema (tables, indexes,
    columns, ...) out of autogenerate (or keeps *only* that, with ``include=True``); ``chain`` is
    your own filter, consulted for everything else."""
    validate_schema_name(schema)

    def include_object(
        obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
    ) -> bool:
        if _schema_of(obj, type_) == schema:
            return include
        if include:
            return False
        return chain(obj, name, type_, reflected, compare_to) if chain else True

    return include_object


#: Leaves the default ``outboxkit`` schema out of autogenerate.
include_object = include_object_for()


def include_name_for(
    schema: str = DEFAULT_SCHEMA,
) -> Callable[[str | None, str, Mapping[Any, Any]], bool]:
    """An ``include_name`` (with ``include_schemas=True``) that does not reflect ``schema``.
    (``Mapping[Any, Any]``: Alembic passes a mapping keyed by literals, so ``dict[str, Any]``
    would not type-check in a strictly typed ``env.py``.)"""
    validate_schema_name(schema)

    def include_name(name: str | None, type_: str, parent_names: Mapping[Any, Any]) -> bool:
        return not (type_ == "schema" and name == schema)

    return include_name


#: For ``include_schemas=True``: do not reflect the ``outboxkit`` schema at all.
include_name = include_name_for()
