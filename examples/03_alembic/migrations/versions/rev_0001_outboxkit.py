"""outboxkit's tables (schema "outboxkit"), applied by Alembic.

Revision ID: 0001_outboxkit
Revises:
"""

from __future__ import annotations

from alembic import op

from outboxkit import alembic_ops

revision = "0001_outboxkit"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Applies every outboxkit migration not applied yet, on Alembic's connection and transaction.
    # After upgrading outboxkit to a version with new migrations, add a revision that calls this
    # again (`outboxkit migrate check` says when the schema is behind).
    alembic_ops.upgrade(op)


def downgrade() -> None:
    raise NotImplementedError("outboxkit's migrations are forward-only")
