"""`prepared_statements = false` (a pooler that cannot keep them, such as PgBouncer in
transaction mode before 1.21): the relay's own connections never prepare a statement, however
often they run it. psycopg prepares one it has run 5 times on a connection by default."""

from __future__ import annotations

from typing import Any

import pytest

from outboxkit.relay.connections import ProcessLeases
from outboxkit.relay.reader import ShardStore
from outboxkit.relay.shard_worker import ShardWorker
from outboxkit.settings import Settings, load_settings
from tests.relay_support import set_shard_count, shard_worker

pytestmark = pytest.mark.integration

PREPARED = "SELECT count(*) FROM pg_prepared_statements"


def _settings(db_url: str, prepared: bool) -> Settings:
    return load_settings(overrides={"database": {"url": db_url, "prepared_statements": prepared}})


def _worker(db_url: str, prepared: bool) -> ShardWorker:
    return shard_worker(_settings(db_url, prepared))


async def _prepared(conn: Any) -> int:
    row = await (await conn.execute(PREPARED)).fetchone()
    return int(row[0])


@pytest.mark.parametrize(("prepared", "expected"), [(True, 1), (False, 0)])
async def test_the_shard_connection_prepares_only_when_allowed(
    outboxkit_db_url: str, prepared: bool, expected: int
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    async with _worker(outboxkit_db_url, prepared)._connect() as conn:
        for _ in range(6):
            await ShardStore("outboxkit").claim(conn, 0, 10)
        assert await _prepared(conn) == expected


@pytest.mark.parametrize(("prepared", "expected"), [(True, 1), (False, 0)])
async def test_the_lease_and_standby_connections_prepare_only_when_allowed(
    outboxkit_db_url: str, prepared: bool, expected: int
) -> None:
    leases = ProcessLeases(_settings(outboxkit_db_url, prepared))
    for lazy in (leases._conn, leases.standby._conn):
        try:
            conn = await lazy.get()
            for _ in range(6):
                await conn.execute("SELECT %s::int", (1,))
            assert await _prepared(conn) == expected
        finally:
            await lazy.drop()
