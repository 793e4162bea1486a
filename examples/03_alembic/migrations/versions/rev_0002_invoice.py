"""The app's own table, next to outboxkit's (made with `alembic revision --autogenerate`).

Revision ID: 0002_invoice
Revises: 0001_outboxkit
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_invoice"
down_revision = "0001_outboxkit"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "example_invoice",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("order_id", sa.String(), nullable=False),
        sa.Column("amount_cents", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_example_invoice_order_id", "example_invoice", ["order_id"])


def downgrade() -> None:
    op.drop_index("ix_example_invoice_order_id", table_name="example_invoice")
    op.drop_table("example_invoice")
