"""LISTEN/NOTIFY as a hint: wake the shard workers early. Polling still finds everything."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable

import psycopg
from pydantic import SecretStr

from outboxkit import db
from outboxkit.log_limit import LimitedLines, normalised
from outboxkit.relay.waiting import backoff_delay

logger = logging.getLogger("outboxkit.relay.notify")
#: Reconnecting waits 1 s, then twice as long after each failure, up to 30 s: polling finds
#: every row meanwhile, and a server that is away is not asked every second.
RECONNECT_INITIAL, RECONNECT_MAX = 1.0, 30.0


async def listen_forever(
    database_url: SecretStr,
    schema: str,
    on_notify: Callable[[int | None], None],
    stop: asyncio.Event,
    track: db.OpenConnections | None = None,
) -> None:
    """Keep a LISTEN connection; reconnect after errors (missed hints are found by polling).

    Writers notify ``notify_channel(schema)`` with the shard number as payload; ``on_notify``
    gets that shard, or None for "maybe any shard".
    """
    said, failures, rng = LimitedLines(logger), 0, random.Random()
    connected: float | None = None  # when the last LISTEN succeeded
    while not stop.is_set():
        try:
            async with (
                db.connection_async(
                    database_url, application_name="outboxkit-relay-listen", track=track
                ) as conn,
                # Closed on leaving, not later by asyncio's finalizer: until then it holds the
                # connection's lock, and a cancellation could find the exit waiting for it.
                contextlib.aclosing(conn.notifies()) as notifications,
            ):
                await db.execute_async(conn, db.query("relay", "listen", schema))
                connected = time.monotonic()
                on_notify(None)  # anything committed while we were not listening
                async for notification in notifications:
                    on_notify(_shard(notification.payload))
                    if stop.is_set():
                        break
        except (psycopg.Error, OSError) as exc:
            # A connection that stayed up a while starts the back-off again; one dropped at once
            # (a proxy, an idle timeout) keeps it growing, as a failure to connect does.
            if connected is not None and time.monotonic() - connected >= RECONNECT_MAX:
                failures = 0
            connected = None
            failures += 1
            kind = normalised(f"{type(exc).__name__}: {exc}")
            said.log(logging.INFO, kind, "listen connection lost (%s); polling meanwhile", exc)
            delay = backoff_delay(failures, RECONNECT_INITIAL, RECONNECT_MAX, rng)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)


def _shard(payload: str) -> int | None:
    try:
        return int(payload)
    except ValueError:
        return None
