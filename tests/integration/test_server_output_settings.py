"""A database whose output settings are not the defaults (``ALTER DATABASE .. SET DateStyle``, as
older or European installations have it): outboxkit reads its results in the binary format,
which these settings do not touch. Before, psycopg's text loaders could not parse a timestamp
written as ``06/12/2026 10:33:33 UTC``: ``relay status``, ``outbox parked``, ``inbox show`` and
the inbox read-back API ended in a ``NotImplementedError`` traceback, a relay's status sampler
(its metrics and /healthz) died at its first backlog count, and a relay that lost its lease
raised it from its explanation of the loss instead of reporting the loss."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

from outboxkit import db
from outboxkit.inbox.readback import get_event, list_events
from outboxkit.relay.lease import LeaseStore
from outboxkit.relay.lease_loss import LeaseLoss
from tests.integration.test_relay_status_sampler import _sampling, _series, _take_lease
from tests.relay_support import cli_ok, insert_rows, set_shard_count
from tests.support.db_names import database_of

pytestmark = pytest.mark.integration

# Each changes how the server writes a value as text; none changes a value.
OUTPUT_SETTINGS = {
    "datestyle": "SQL, DMY",
    "intervalstyle": "sql_standard",
    "timezone": "Asia/Kolkata",
    "extra_float_digits": "-15",
    "bytea_output": "escape",
}


@pytest.fixture
def odd_db_url(outboxkit_db_url: str) -> str:
    """The test's database with every setting above as its default, checked to defeat a text
    read of a timestamp (what the tests here guard against)."""
    database = database_of(outboxkit_db_url)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        for name, value in OUTPUT_SETTINGS.items():
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                    sql.Identifier(database), sql.Identifier(name), sql.Literal(value)
                )
            )
    with psycopg.connect(outboxkit_db_url) as conn, pytest.raises(NotImplementedError):
        conn.execute("SELECT now()").fetchone()
    return outboxkit_db_url


def _iso_read(db_url: str, query: str) -> Any:
    """One value read with DateStyle ISO, the way psycopg can read text."""
    with psycopg.connect(db_url, options="-c DateStyle=ISO") as conn:
        row = conn.execute(query).fetchone()
        assert row is not None
        return row[0]


def test_operator_commands_read_timestamps(odd_db_url: str) -> None:
    [row_id] = insert_rows(odd_db_url, "t", [("k", b"{}")])
    with psycopg.connect(odd_db_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE outboxkit.outbox_message SET state = 'parked', parked_reason = 'refused',"
            " parked_at = now() WHERE id = %s",
            (row_id,),
        )
    parked_at = _iso_read(odd_db_url, "SELECT parked_at FROM outboxkit.outbox_message")
    [item] = json.loads(cli_ok(odd_db_url, "outbox", "parked", "--json"))
    assert datetime.fromisoformat(item["parked_at"]) == parked_at

    cli_ok(
        odd_db_url, "inbox", "cancel", "--consumer", "c", "--event-id", "e2", "--before-delivery"
    )
    finished = _iso_read(odd_db_url, "SELECT finished_at FROM outboxkit.inbox_message")
    assert finished.isoformat() in cli_ok(odd_db_url, "inbox", "show", "--consumer", "c")
    detail = cli_ok(odd_db_url, "inbox", "show", "--consumer", "c", "--event-id", "e2")
    assert "cancelled" in detail

    engine = sa.create_engine(odd_db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        record = get_event(engine, "c", "e2")
        assert record is not None
        assert record.finished_at == finished
        assert [r.finished_at for r in list_events(engine, consumer="c")] == [finished]
    finally:
        engine.dispose()


async def test_relay_status_and_a_lost_lease_read_the_lease_row(odd_db_url: str) -> None:
    set_shard_count(odd_db_url, 1)
    leases = LeaseStore("outboxkit")
    later = datetime.now(UTC) + timedelta(seconds=31)
    async with await db.connect_async(odd_db_url) as a, await db.connect_async(odd_db_url) as b:
        first = await leases.acquire(a, "default", 0, "A", 30)
        assert first is not None
        [shard] = json.loads(cli_ok(odd_db_url, "relay", "status", "--json"))["shards"]
        expires = _iso_read(odd_db_url, "SELECT expires_at FROM outboxkit.relay_lease")
        assert datetime.fromisoformat(shard["lease_expires_at"]) == expires
        # B takes the expired lease over; A's renewal fails and says why from the lease row.
        assert await leases.acquire(b, "default", 0, "B", 30, now=later) is not None
        assert not await leases.renew(a, first, now=later)
        assert first.lost_cause is LeaseLoss.TAKEN_OVER, first.lost_reason


async def test_the_relays_status_sampler_counts_the_backlog(
    odd_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _take_lease(odd_db_url, "me")  # the count reads its expiry
    async with _sampling(odd_db_url, monkeypatch) as (reads, metrics):
        await reads.until_count()
        assert _series(metrics.backlog) == {"0": 10}
        assert _series(metrics.oldest_pending).keys() == {"0"}
