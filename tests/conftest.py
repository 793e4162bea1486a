"""Shared test configuration. Service fixtures come from ``outboxkit.pytest_plugin``."""

from __future__ import annotations

import pytest

from outboxkit.devstack.postgres import sqlalchemy_url


@pytest.fixture
def sa_url(outboxkit_db_url: str) -> str:
    """The fresh test database as a SQLAlchemy URL (psycopg 3 driver)."""
    return sqlalchemy_url(outboxkit_db_url)
