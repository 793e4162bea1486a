"""LISTEN on a connection of our own: the one statement whose operand is an identifier, not a
parameter, so it cannot be a named statement with ``:name`` placeholders."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql


def _listen(channel: str) -> sql.Composed:
    return sql.SQL("LISTEN {}").format(sql.Identifier(channel))


def listen(conn: psycopg.Connection[Any], channel: str) -> None:
    """Subscribe ``conn`` (autocommit, or notifications wait for its commit) to ``channel``;
    read them with ``conn.notifies()``."""
    conn.execute(_listen(channel))


async def listen_async(conn: psycopg.AsyncConnection[Any], channel: str) -> None:
    """:func:`listen` for asyncio (``async for n in conn.notifies()``)."""
    await conn.execute(_listen(channel))
