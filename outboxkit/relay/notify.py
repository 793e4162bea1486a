"""LISTEN/NOTIFY as a hint: wake the shard workers early. Polling still finds everything."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import psycopg
from pydantic import SecretStr

from outboxkit import db

logger = logging.getLogger("outboxkit.relay.notify")


async def listen_forever(
    database_url: SecretStr,
    schema: str,
    on_notify: Callable[[int | None], None],
    stop: asyncio.Event,
) -> None:
    """Keep a LISTEN connection; reconnect after errors (missed hints are found by polling).

    Writers notify ``notify_channel(schema)`` with the shard number as payload; ``on_notify``
    gets that shard, or None for "maybe any shard".
    """
    while not stop.is_set():
        try:
            async with (
                db.connection_async(
                    database_url, application_name="outboxkit-relay-listen"
                ) as conn,
                # Closed on leaving, not later by asyncio's finalizer: until then it holds the
                # connection's lock, and a cancellation could find the exit waiting for it.
                contextlib.aclosing(conn.notifies()) as notifications,
            ):
                await db.execute_async(conn, db.query("relay", "listen", schema))
                on_notify(None)  # anything committed while we were not listening
                async for notification in notifications:
                    on_notify(_shard(notification.payload))
                    if stop.is_set():
                        break
        except (psycopg.Error, OSError) as exc:
            logger.info("listen connection lost (%s); polling meanwhile", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)


def _shard(payload: str) -> int | None:
    try:
        return int(payload)
    except ValueError:
        return None
