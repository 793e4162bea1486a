"""One connection per relay process for every standby shard's lease attempts.

A standby worker only tries, every poll interval, to take its shard's lease: a single short
statement. Giving each standby a connection of its own would cost one server connection per
watched shard and process (1,024 shards, a few processes: thousands). Here every standby of a
process takes turns on one shared connection; only a worker that won its lease opens one of its
own, for data (see ``connections`` for the whole budget).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from outboxkit import db
from outboxkit.db.abandon import shut
from outboxkit.db.engines import ended_while_idle
from outboxkit.relay.lease import LeaseStore, LeaseTerm
from outboxkit.settings import Settings

Conn = psycopg.AsyncConnection[Any]


class LazyConnection:
    """One autocommit connection of ours, (re)opened on demand once it closed, broke or was
    ended by the server while idle."""

    def __init__(
        self,
        url: db.Url,
        application_name: str,
        track: db.OpenConnections | None = None,
        **options: Any,
    ) -> None:
        self._url = url
        self._name = application_name
        self._track = track
        self._options = options
        self._conn: Conn | None = None
        self.opened = 0  # connections opened so far (observability, tests)

    async def get(self) -> Conn:
        if self._conn is not None and not self._conn.closed and ended_while_idle(self._conn):
            # The server ended it while it sat idle (an idle_session_timeout, a restart): a new
            # one now, rather than a failed statement, a logged error and a retry later.
            await self.drop()
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = await db.connect_async(
                self._url,
                application_name=self._name,
                **db.connect_timeout(self._url),
                track=self._track,
                **self._options,
            )
            self.opened += 1
        return self._conn

    def shut(self) -> bool:
        """End the statement waiting on the connection, if any (:func:`db.abandon.shut`)."""
        return self._conn is not None and shut(self._conn)

    async def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()


class StandbyConnection:
    """Serialised lease attempts on one lazily (re)opened autocommit connection."""

    def __init__(
        self,
        settings: Settings,
        leases: LeaseStore | None = None,
        track: db.OpenConnections | None = None,
    ) -> None:
        self._leases = leases or LeaseStore(settings.schema_name)
        self._conn = LazyConnection(
            settings.database_url,
            "outboxkit-relay-standby",
            track,
            **settings.database.connect_options(),
        )
        self._lock = asyncio.Lock()

    @property
    def opened(self) -> int:
        return self._conn.opened

    async def acquire(
        self, group: str, shard: int, holder: str, ttl: float, *, level: int = logging.INFO
    ) -> LeaseTerm | None:
        """One attempt to take ``shard``'s lease; a connection error drops the connection."""
        async with self._lock:
            conn = await self._conn.get()
            try:
                return await self._leases.acquire(conn, group, shard, holder, ttl, level=level)
            except (psycopg.Error, OSError):
                await self._conn.drop()
                raise

    async def close(self) -> None:
        async with self._lock:
            await self._conn.drop()
