"""SQLAlchemy ``Table`` objects for the outboxkit tables, for Alembic autogenerate.

The SQL files in ``migrations/`` create the schema; these objects only *describe* it so a user's
autogenerate can include or exclude them (see :mod:`outboxkit.alembic_ops`). They are not used
to create anything. ``tests/integration/test_migrations.py`` applies every migration to an empty
database and fails if these definitions and the real tables differ in any table, column, type,
nullability or primary key — so they cannot drift from the migrations.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects.postgresql import base as pg_base
from sqlalchemy.types import UserDefinedType

from outboxkit.migrator import DEFAULT_SCHEMA, validate_schema_name


class Xid8(UserDefinedType[str]):
    """PostgreSQL's 64-bit transaction id (``pg_current_xact_id()``)."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "XID8"


# Let reflection (Alembic autogenerate) recognise xid8 instead of warning about an unknown type.
pg_base.ischema_names.setdefault("xid8", Xid8)


def _tstz() -> sa.DateTime:
    return sa.DateTime(timezone=True)


@cache
def metadata_for(schema: str = DEFAULT_SCHEMA) -> sa.MetaData:
    """Every outboxkit table in ``schema``, in one MetaData (cached per schema)."""
    validate_schema_name(schema)
    md = sa.MetaData(schema=schema)
    sa.Table(
        "schema_migration",
        md,
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("checksum", sa.Text, nullable=False),
        sa.Column("applied_at", _tstz(), nullable=False, server_default=sa.func.now()),
    )
    sa.Table(
        "outbox_setting",
        md,
        sa.Column("singleton", sa.Boolean, primary_key=True, server_default=sa.true()),
        sa.Column("shard_count", sa.Integer, nullable=False, server_default="1"),
    )
    sa.Table(
        "outbox_message",
        md,
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("event_id", pg.UUID(as_uuid=True), nullable=False, unique=True),
        sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
        sa.Column("content_digest", pg.BYTEA, nullable=False),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("message_key", sa.Text),
        sa.Column("payload", pg.BYTEA, nullable=False),
        sa.Column("content_type", sa.Text, nullable=False),
        sa.Column("headers", pg.JSONB, nullable=False),
        sa.Column("event_type", sa.Text),
        sa.Column("schema_version", sa.Integer),
        sa.Column("aggregate_type", sa.Text),
        sa.Column("aggregate_id", sa.Text),
        sa.Column("shard", sa.Integer, nullable=False),
        sa.Column("xact_id", Xid8(), nullable=False),
        sa.Column("created_at", _tstz(), nullable=False),
        sa.Column("deliver_after", _tstz()),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", _tstz()),
        sa.Column("last_error", sa.Text),
        sa.Column("parked_reason", sa.Text),
        sa.Column("parked_at", _tstz()),
        sa.Column("published_at", _tstz()),
        sa.Column("kafka_partition", sa.Integer),
        sa.Column("kafka_offset", sa.BigInteger),
    )
    sa.Table(
        "relay_lease",
        md,
        sa.Column("relay_group", sa.Text, primary_key=True),
        sa.Column("shard", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("holder", sa.Text),
        sa.Column("token", sa.BigInteger, nullable=False),
        sa.Column("acquired_at", _tstz(), nullable=False),
        sa.Column("renewed_at", _tstz(), nullable=False),
        sa.Column("expires_at", _tstz(), nullable=False),
    )
    sa.Table(
        "relay_control",
        md,
        sa.Column("relay_group", sa.Text, primary_key=True),
        sa.Column("paused", sa.Boolean, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("changed_by", sa.Text),
        sa.Column("changed_at", _tstz(), nullable=False),
    )
    sa.Sequence("relay_fencing_token_seq", metadata=md, data_type=sa.BigInteger)
    sa.Table(
        "inbox_message",
        md,
        sa.Column("consumer", sa.Text, primary_key=True),
        sa.Column("event_id", sa.Text, primary_key=True),
        sa.Column("idempotency_key", sa.Text),
        sa.Column("content_digest", pg.BYTEA),
        sa.Column("event_type", sa.Text),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text),
        sa.Column("lease_owner", sa.Text),
        sa.Column("lease_token", sa.BigInteger),
        sa.Column("lease_expires_at", _tstz()),
        sa.Column("lease_lost_count", sa.Integer, nullable=False),
        sa.Column("topic", sa.Text),
        sa.Column("kafka_partition", sa.Integer),
        sa.Column("kafka_offset", sa.BigInteger),
        sa.Column("duplicate_count", sa.Integer, nullable=False),
        sa.Column("created_at", _tstz(), nullable=False),
        sa.Column("updated_at", _tstz(), nullable=False),
        sa.Column("finished_at", _tstz()),
    )
    sa.Table(
        "inbox_rejection",
        md,
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("consumer", sa.Text, nullable=False),
        sa.Column("event_id", sa.Text),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("content_digest", pg.BYTEA),
        sa.Column("event_type", sa.Text),
        sa.Column("topic", sa.Text, nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("kafka_offset", sa.BigInteger, nullable=False),
        sa.Column("created_at", _tstz(), nullable=False),
    )
    sa.Sequence("inbox_lease_token_seq", metadata=md, data_type=sa.BigInteger)
    return md


def table(name: str, schema: str = DEFAULT_SCHEMA) -> sa.Table:
    return metadata_for(schema).tables[f"{schema}.{name}"]


metadata = metadata_for(DEFAULT_SCHEMA)
outbox_message = table("outbox_message")
outbox_setting = table("outbox_setting")
relay_lease = table("relay_lease")
relay_control = table("relay_control")
schema_migration = table("schema_migration")
inbox_message = table("inbox_message")
inbox_rejection = table("inbox_rejection")
