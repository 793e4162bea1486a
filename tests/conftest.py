"""Shared test configuration. Service fixtures come from the opt-in ``outboxkit.pytest_plugin``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from outboxkit.db import sqlalchemy_url
from tests.relay_support import RelayProcess

pytest_plugins = ["outboxkit.pytest_plugin"]


@pytest.fixture
def sa_url(outboxkit_db_url: str) -> str:
    """The fresh test database as a SQLAlchemy URL (psycopg 3 driver)."""
    return sqlalchemy_url(outboxkit_db_url)


@pytest.fixture
def engine(sa_url: str) -> Iterator[sa.Engine]:
    """An engine on the fresh test database (a test module may define its own)."""
    eng = sa.create_engine(sa_url)
    yield eng
    eng.dispose()


@pytest.fixture
async def aengine(sa_url: str) -> AsyncIterator[AsyncEngine]:
    """:func:`engine` for asyncio."""
    eng = create_async_engine(sa_url)
    yield eng
    await eng.dispose()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by its folder, so ``pytest -m unit`` (or ``-m "not fault"``) selects."""
    for item in items:
        for kind in ("unit", "integration", "fault"):
            if f"/tests/{kind}/" in str(item.path):
                item.add_marker(getattr(pytest.mark, kind))


@pytest.fixture
def processes() -> Iterator[list[RelayProcess]]:
    """Relay processes a test starts (append them); stopped when it ends."""
    started: list[RelayProcess] = []
    yield started
    for proc in started:
        proc.stop()
