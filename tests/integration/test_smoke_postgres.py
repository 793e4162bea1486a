"""The self-started PostgreSQL is real and SQLAlchemy reaches it (sync and async)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from outboxkit.db import migrator


def test_sync_write_and_read(sa_url: str) -> None:
    engine = sa.create_engine(sa_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE smoke (id int PRIMARY KEY, note text)"))
            conn.execute(sa.text("INSERT INTO smoke VALUES (1, 'hello')"))
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT note FROM smoke WHERE id = 1")).scalar() == "hello"
            assert "PostgreSQL 1" in str(conn.execute(sa.text("SELECT version()")).scalar())
    finally:
        engine.dispose()


async def test_async_write_and_read(sa_url: str) -> None:
    engine = create_async_engine(sa_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("CREATE TABLE smoke (id int PRIMARY KEY, note text)"))
            await conn.execute(sa.text("INSERT INTO smoke VALUES (1, 'async')"))
        async with engine.connect() as conn:
            result = await conn.execute(sa.text("SELECT note FROM smoke WHERE id = 1"))
            assert result.scalar() == "async"
    finally:
        await engine.dispose()


def test_template_database_is_migrated(outboxkit_db_url: str) -> None:
    assert migrator.status(outboxkit_db_url).is_current
