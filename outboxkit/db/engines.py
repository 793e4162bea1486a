"""The SQLAlchemy engines outboxkit's own processes make (``inbox run``, the ``inbox`` commands,
``outboxkit verify``'s writers, the demo), made in one place.

Each one gets what our own psycopg connections get (:func:`~outboxkit.db.connect.connect`): the
URL checked and turned into SQLAlchemy's form without quoting it in an error, and the option that
keeps libpq from prompting for an encrypted client key's pass phrase (a prompt blocks the process
until someone types). An application's own engine stays the application's to make.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outboxkit.db.connect import Url, prompt_free, sqlalchemy_url

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine


def engine_options(url: Url, connect_args: dict[str, Any] | None) -> dict[str, Any]:
    """The ``connect_args`` an engine of ours passes psycopg: the caller's win."""
    return {**prompt_free(url), **(connect_args or {})}


def sync_engine(url: Url, *, connect_args: dict[str, Any] | None = None, **options: Any) -> Engine:
    """A SQLAlchemy engine over psycopg for ``url`` (a libpq URL); ``options`` go to
    :func:`sqlalchemy.create_engine` (pool size and the like)."""
    from sqlalchemy import create_engine

    return create_engine(
        sqlalchemy_url(url), connect_args=engine_options(url, connect_args), **options
    )


def async_engine(
    url: Url, *, connect_args: dict[str, Any] | None = None, **options: Any
) -> AsyncEngine:
    """:func:`sync_engine` for asyncio."""
    from sqlalchemy.ext.asyncio import create_async_engine

    return create_async_engine(
        sqlalchemy_url(url), connect_args=engine_options(url, connect_args), **options
    )
