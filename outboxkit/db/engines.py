"""The SQLAlchemy engines outboxkit's own processes make (``inbox run``, the ``inbox`` commands,
``outboxkit verify``'s writers, the demo), made in one place.

Each one gets what our own psycopg connections get (:func:`~outboxkit.db.connect.connect`): the
URL checked and turned into SQLAlchemy's form without quoting it in an error, and the option that
keeps libpq from prompting for an encrypted client key's pass phrase (a prompt blocks the process
until someone types). An application's own engine stays the application's to make.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr

from outboxkit.db.connect import Url, prompt_free, sqlalchemy_url

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine
    from sqlalchemy.ext.asyncio import AsyncEngine


def engine_options(url: Url, connect_args: dict[str, Any] | None) -> dict[str, Any]:
    """The ``connect_args`` an engine of ours passes psycopg: the caller's win."""
    return {**prompt_free(url), **(connect_args or {})}


def session_name(url: Url, name: str) -> dict[str, str]:
    """``application_name`` for the sessions of one of our processes, so an operator finds them
    in ``pg_stat_activity``; nothing when the URL, a service file or ``PGAPPNAME`` names them
    (an option of ours would override theirs)."""
    try:
        params = conninfo_to_dict(url.get_secret_value() if isinstance(url, SecretStr) else url)
    except (psycopg.Error, ValueError, TypeError):  # the connection attempt reports it
        return {}
    if params.get("application_name") or params.get("service"):
        return {}
    if os.environ.get("PGAPPNAME") or os.environ.get("PGSERVICE"):
        return {}
    return {"application_name": name}


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
