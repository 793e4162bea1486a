"""LISTEN/NOTIFY as a hint: wake the shard workers early. Polling still finds everything."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import psycopg
from psycopg import sql

logger = logging.getLogger("outboxkit.relay.notify")


def channel(schema: str) -> str:
    return f"{schema}.outbox"


async def listen_forever(
    database_url: str, schema: str, on_notify: Callable[[], None], stop: asyncio.Event
) -> None:
    """Keep a LISTEN connection; reconnect after errors (missed hints are found by polling)."""
    while not stop.is_set():
        try:
            async with await psycopg.AsyncConnection.connect(
                database_url, autocommit=True, application_name="outboxkit-relay-listen"
            ) as conn:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel(schema))))
                on_notify()  # anything committed while we were not listening
                async for _ in conn.notifies():
                    on_notify()
                    if stop.is_set():
                        break
        except (psycopg.Error, OSError) as exc:
            logger.info("listen connection lost (%s); polling meanwhile", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
