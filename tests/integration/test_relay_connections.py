"""Connections are bounded: per relay process one standby connection (lease attempts of every shard
it does not hold), one lease connection (every held lease renewed in one statement), one data
connection per held shard, and no more than ``max_shards_per_process`` held shards.

Relays run in-process, two processes' worth; the group is paused, so no Kafka producer is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import psycopg
import pytest

from outboxkit.relay.connections import ProcessLeases
from outboxkit.relay.lease_loss import LeaseLoss
from outboxkit.relay.runner import Relay
from tests.relay_support import relay_settings, running_relay, set_shard_count
from tests.support.activity import statement_running
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration


def _relay_connections(db_url: str) -> dict[str, int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'outboxkit-relay%'"
            " GROUP BY 1"
        ).fetchall()
    by_kind: dict[str, int] = {}
    for name, count in rows:
        kind = "shard" if str(name).removeprefix("outboxkit-relay-").isdigit() else str(name)
        by_kind[kind] = by_kind.get(kind, 0) + int(count)
    return by_kind


def _paused_group(db_url: str, shards: int) -> None:
    set_shard_count(db_url, shards)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outboxkit.relay_control (relay_group, paused) VALUES ('default', true)"
        )


def _renewed_at(db_url: str, holder: str) -> list[tuple[object, int]]:
    """(renewed_at, rows) of the holder's leases: one statement renews all at one ``now()``."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        return [
            (row[0], int(row[1]))
            for row in conn.execute(
                "SELECT renewed_at, count(*) FROM outboxkit.relay_lease"
                " WHERE holder = %s AND renewed_at > acquired_at GROUP BY 1",
                (holder,),
            )
        ]


def _held(relay: Relay) -> int:
    return sum(1 for w in relay.workers.values() if w.active.is_set())


@contextlib.asynccontextmanager
async def _holding_four(db_url: str, bootstrap: str) -> AsyncIterator[Relay]:
    """One relay process holding all 4 shards of a paused group, renewing every 2 s."""
    _paused_group(db_url, 4)
    settings = relay_settings(db_url, bootstrap, mode="at_least_once", lease_ttl=6.0)
    async with running_relay(settings, holder="first") as relay:
        await wait_for_async(lambda: _held(relay) == 4, what="all held")
        yield relay


async def test_many_held_shards_cost_one_connection_each_plus_two(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str
) -> None:
    shards = 120  # held with 2 connections each (the old way) this would pass max_connections
    _paused_group(outboxkit_db_url, shards)
    settings = relay_settings(
        outboxkit_db_url, outboxkit_kafka_bootstrap, mode="at_least_once", lease_ttl=6.0
    )
    async with running_relay(settings, holder="first") as first:
        await wait_for_async(lambda: _held(first) == shards, what="all held")
        async with running_relay(settings, holder="second") as second:
            assert first.leases is not None
            assert second.leases is not None
            await wait_for_async(
                lambda: (
                    second.leases is not None
                    and second.leases.standby.opened >= 1
                    and _relay_connections(outboxkit_db_url).get("outboxkit-relay-standby") == 2
                ),
                what="both processes' standby connections",
            )
            # Every renewal covers every held lease in ONE statement: one now() for all rows.
            leases = first.leases
            start = leases.renewals
            await wait_for_async(lambda: leases.renewals >= start + 2, what="two renewals")
            assert [rows for _, rows in _renewed_at(outboxkit_db_url, "first")] == [shards]
            counts = _relay_connections(outboxkit_db_url)
            print(f"relay connections, {shards} shards held by one of two processes: {counts}")
            assert _held(first) == shards
            assert _held(second) == 0
            assert counts["shard"] == shards  # the holder's data connections, one per shard
            assert counts["outboxkit-relay-leases"] == 1  # only the holder renews anything
            assert counts["outboxkit-relay-standby"] == 2  # one per process, whatever the shards
            assert first.leases.opened == 1  # never reopened: no renewal failed
            assert sum(counts.values()) <= shards + 2 * 4, counts


async def test_max_shards_per_process_leaves_the_rest_to_other_processes(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str
) -> None:
    shards, cap = 64, 40
    _paused_group(outboxkit_db_url, shards)
    settings = relay_settings(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        mode="at_least_once",
        lease_ttl=6.0,
        max_shards_per_process=cap,
    )
    async with running_relay(settings, holder="first") as first:
        await wait_for_async(lambda: _held(first) == cap, what="the first process at its cap")
        async with running_relay(settings, holder="second") as second:
            await wait_for_async(
                lambda: _held(second) == shards - cap, what="the second holds the rest"
            )
            both = [r.leases for r in (first, second) if r.leases is not None]
            await wait_for_async(
                lambda: all(leases.renewals >= 1 for leases in both), what="a renewal in each"
            )
            counts = _relay_connections(outboxkit_db_url)
            print(f"relay connections, {shards} shards, cap {cap}, two processes: {counts}")
            assert _held(first) == cap  # never more, though it watches every shard
            assert counts["shard"] == shards
            assert counts["outboxkit-relay-leases"] == 2
            assert counts["outboxkit-relay-standby"] == 2
            assert sum(counts.values()) <= shards + 2 * 4, counts


async def test_a_lease_taken_over_is_lost_alone_in_the_shared_renewal(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str
) -> None:
    async with _holding_four(outboxkit_db_url, outboxkit_kafka_bootstrap) as relay:
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(
                "UPDATE outboxkit.relay_lease SET holder = 'thief', token = token + 1000"
                " WHERE shard = 2"
            )
        victim = relay.workers[2]
        await wait_for_async(lambda: victim.lease_lost_count == 1, what="shard 2 lease lost")
        assert not victim.active.is_set()
        assert [w.lease_lost_count for s, w in relay.workers.items() if s != 2] == [0, 0, 0]
        assert _held(relay) == 3
        counted = {  # counted with the reason the lease row shows
            (sample.labels["shard"], sample.labels["reason"])
            for metric in relay.metrics.lease_lost.collect()
            for sample in metric.samples
            if sample.name.endswith("_total") and sample.value
        }
        assert counted == {("2", LeaseLoss.TAKEN_OVER)}


async def test_a_broken_lease_connection_is_reopened_and_no_lease_lost(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str
) -> None:
    async with _holding_four(outboxkit_db_url, outboxkit_kafka_bootstrap) as relay:
        leases = relay.leases
        assert leases is not None
        await wait_for_async(lambda: leases.opened == 1, what="renewing")
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database()"
                " AND application_name = 'outboxkit-relay-leases'"
            ).fetchone()
        assert killed == (1,)
        start = leases.renewals
        await wait_for_async(
            lambda: leases.opened == 2 and leases.renewals >= start + 2, what="renewed again"
        )
        assert _held(relay) == 4
        assert [w.lease_lost_count for w in relay.workers.values()] == [0, 0, 0, 0]


async def test_every_connection_of_the_process_is_where_a_stop_finds_it(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str
) -> None:
    """A stop the database does not answer ends the statements of every connection the
    relay has open (``outboxkit.db.abandon``): each of them is tracked, in one place."""
    async with _holding_four(outboxkit_db_url, outboxkit_kafka_bootstrap) as relay:
        await wait_for_async(
            lambda: (
                (server := sum(_relay_connections(outboxkit_db_url).values())) >= 6
                and len(relay.connections) == server
            ),
            what="the server's count of the relay's connections and the tracked ones agreeing",
        )


def _lease_connection_sleeps(db_url: str) -> bool:
    return statement_running(db_url, "outboxkit-relay-leases", "pg_sleep")


async def _sleep_on_lease_connection(leases: ProcessLeases) -> None:
    conn = await leases._conn.get()
    await conn.execute("SET client_connection_check_interval = '100ms'; SELECT pg_sleep(30)")


async def test_a_lease_statement_that_does_not_answer_is_shut_not_cancelled(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal or release that waited its interval ends at once (psycopg's cancel would ask
    the server and wait up to 10 s more, with the lease connection's lock held)."""
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, lease_ttl=1.5)
    leases = ProcessLeases(settings)
    try:
        began = time.monotonic()
        with pytest.raises(TimeoutError, match=r"no answer within 0\.5 s"):
            await leases._bounded(_sleep_on_lease_connection(leases))
        assert time.monotonic() - began < 3.0  # the interval, then the shut statement's end
        assert "query cancellation" not in caplog.text
        conn = await leases._conn.get()  # broken: a new one
        assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
    finally:
        await leases.close()


async def test_a_cancelled_caller_of_a_bounded_lease_statement_is_cancelled(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str
) -> None:
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, lease_ttl=30.0)
    leases = ProcessLeases(settings)
    try:
        caller = asyncio.ensure_future(leases._bounded(_sleep_on_lease_connection(leases)))
        await wait_for_async(
            lambda: _lease_connection_sleeps(outboxkit_db_url), what="the statement running"
        )
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(caller, 5.0)
        # the statement was shut, not cancelled: the lock is free again at once
        await asyncio.wait_for(leases._lock.acquire(), 5.0)
        leases._lock.release()
    finally:
        await leases.close()
