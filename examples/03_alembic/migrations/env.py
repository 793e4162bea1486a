"""Alembic's environment for the example app (online mode only: outboxkit's migrations run on a
live connection, not as offline SQL)."""

from __future__ import annotations

import os

from alembic import context
from billing_models import Base
from sqlalchemy import create_engine, make_url

from outboxkit import alembic_ops

config = context.config
# `alembic` from the command line: OUTBOXKIT_DATABASE_URL; from Python: config.attributes["url"].
url = make_url(config.attributes.get("url") or os.environ["OUTBOXKIT_DATABASE_URL"])
engine = create_engine(
    url.set(drivername="postgresql+psycopg"),  # outboxkit's helper needs psycopg 3
    # Pin the default schema. PostgreSQL's default search_path starts with "$user": a role named
    # like outboxkit's schema ("outboxkit", as in the dev stack) would otherwise get that schema
    # as its default once it exists, so your tables would be created in it and autogenerate
    # would take outboxkit's tables for yours.
    connect_args={"options": "-c search_path=public"},
)

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # Compare every schema with the models, except outboxkit's: its tables come from its own
        # migrations (revision 0001 here), not from your models, so autogenerate must not try to
        # drop them.
        include_schemas=True,
        include_name=alembic_ops.include_name,
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
