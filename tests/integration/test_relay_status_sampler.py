"""The sampler reads holders every interval and counts the backlog only as its cost allows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
import pytest

from outboxkit import db
from outboxkit.relay import status_sampler
from outboxkit.relay.metrics import RelayMetrics

pytestmark = pytest.mark.integration

_FILL = """
INSERT INTO outboxkit.outbox_message
    (event_id, idempotency_key, content_digest, topic, message_key, payload, shard)
SELECT gen_random_uuid(), 'k' || g || '-' || %(batch)s, '\\x00', 'orders', 'key', '\\x7b7d',
       %(shard)s
FROM generate_series(1, %(rows)s) AS g
"""


def _gauge(metric: Any, shard: str) -> float:
    value: float = metric.labels(shard)._value.get()
    return value


def _series(metric: Any) -> dict[str, float]:
    """The shards a gauge exports, with their values (without creating a series)."""
    return {
        sample.labels["shard"]: sample.value
        for family in metric.collect()
        for sample in family.samples
    }


def _take_lease(url: str, holder: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        db.one(
            conn,
            db.query("relay", "lease_acquire", "outboxkit"),
            {"group": "default", "shard": 0, "holder": holder, "ttl": 60, "now": None},
        )


class _Recorder:
    """The names of the statements the sampler read rows with, in order: the test's signal."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.done: asyncio.Queue[str] = asyncio.Queue()
        self.only: list[list[int] | None] = []  # each count's shards (None: all it counts)
        real_rows = db.rows_async

        async def recorded(conn: Any, query: db.Query, params: Any = None) -> Sequence[Any]:
            found = await real_rows(conn, query, params)
            if query.name == "status":
                self.only.append(params["only"])
            self.done.put_nowait(query.name)
            return found

        monkeypatch.setattr(status_sampler.db, "rows_async", recorded)

    async def next(self) -> str:
        return await asyncio.wait_for(self.done.get(), 30)

    async def until_count(self) -> None:
        """Holders reads, a count, and the read after it (which begins once the count's gauges
        are set)."""
        async with asyncio.timeout(30):  # holders reads come every 10 ms: bound them too
            while (name := await self.next()) != "status":
                assert name == "holders"
        assert await self.next() == "holders"


@contextlib.asynccontextmanager
async def _sampling(
    url: str, monkeypatch: pytest.MonkeyPatch, every: float = 0.01
) -> AsyncIterator[tuple[_Recorder, RelayMetrics]]:
    """The sampler of relay process "me" over 10 pending rows of shard 0, every 10 ms (or
    ``every`` s), whose backlog count, once made, is not due again for an hour."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(_FILL, {"rows": 10, "batch": 1, "shard": 0})
    monkeypatch.setattr(status_sampler, "backlog_delay", lambda *_: 3600.0)
    reads = _Recorder(monkeypatch)
    metrics, stop = RelayMetrics(), asyncio.Event()
    task = asyncio.create_task(
        status_sampler.sample_forever(url, "outboxkit", "default", "me", metrics, stop, every=every)
    )
    try:
        yield reads, metrics
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_holders_are_read_every_interval_while_a_costly_count_waits(
    outboxkit_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _sampling(outboxkit_db_url, monkeypatch) as (reads, metrics):
        await reads.until_count()
        assert _gauge(metrics.backlog, "0") == 10
        assert _gauge(metrics.group_active, "0") == 0
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(_FILL, {"rows": 5, "batch": 2, "shard": 0})
        _take_lease(outboxkit_db_url, "me")  # still ours to count: no new count is due
        # Holders read after the lease was taken: twice, so the second began after it.
        assert [await reads.next() for _ in range(2)] == ["holders"] * 2
        while not reads.done.empty():
            assert reads.done.get_nowait() == "holders"
        assert _gauge(metrics.group_active, "0") == 1
        assert _gauge(metrics.backlog, "0") == 10  # not counted again


async def test_a_shard_another_process_holds_is_not_reported_until_its_holder_goes(
    outboxkit_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _take_lease(outboxkit_db_url, "other")
    async with _sampling(outboxkit_db_url, monkeypatch) as (reads, metrics):
        await reads.until_count()
        assert _series(metrics.backlog) == {}  # the other process reports it
        assert _gauge(metrics.group_active, "0") == 1
        assert metrics.healthy()[0]
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute("UPDATE outboxkit.relay_lease SET holder = NULL")  # the holder is gone
        # Counted at once, although the next count was an hour away: /healthz must see it.
        await reads.until_count()
        assert _series(metrics.backlog) == {"0": 10}
        assert _series(metrics.oldest_pending).keys() == {"0"}
        assert metrics.healthy() == (False, {"shards_with_backlog_and_no_holder": ["0"]})
        _take_lease(outboxkit_db_url, "other")
        assert await reads.next() == "holders"
        assert await reads.next() == "holders"  # began after the lease was taken
        assert _series(metrics.backlog) == {}
        assert _series(metrics.oldest_pending) == {}
        assert metrics.healthy()[0]


async def test_the_holder_itself_counts_again_when_its_lease_is_gone(
    outboxkit_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _take_lease(outboxkit_db_url, "me")
    async with _sampling(outboxkit_db_url, monkeypatch) as (reads, metrics):
        await reads.until_count()
        assert _series(metrics.backlog) == {"0": 10}
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(_FILL, {"rows": 5, "batch": 2, "shard": 0})
            conn.execute("UPDATE outboxkit.relay_lease SET holder = NULL")  # released
        await reads.until_count()  # although the next count was an hour away
        assert _series(metrics.backlog) == {"0": 15}
        assert metrics.healthy() == (False, {"shards_with_backlog_and_no_holder": ["0"]})


async def test_series_set_before_a_reconnect_are_dropped_after_it(
    outboxkit_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _sampling(outboxkit_db_url, monkeypatch) as (reads, metrics):
        await reads.until_count()
        assert _series(metrics.backlog) == {"0": 10}
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'outboxkit-relay-sample'"
                " AND datname = current_database()"
            )
        _take_lease(outboxkit_db_url, "other")  # seen only by the new connection
        while not reads.done.empty():
            reads.done.get_nowait()
        # The second began on the new connection (the first may be the old one's last).
        assert [await reads.next() for _ in range(2)] == ["holders"] * 2
        assert reads.only == [None]  # the pause outlived the reconnect: no new full count
        assert _series(metrics.backlog) == {}
        assert _series(metrics.oldest_pending) == {}


async def test_a_shard_whose_holder_went_is_counted_alone(
    outboxkit_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute("UPDATE outboxkit.outbox_setting SET shard_count = 2")
        conn.execute(_FILL, {"rows": 7, "batch": 3, "shard": 1})
    _take_lease(outboxkit_db_url, "me")  # shard 0 ours, shard 1 nobody's
    async with _sampling(outboxkit_db_url, monkeypatch) as (reads, metrics):
        await reads.until_count()
        assert _series(metrics.backlog) == {"0": 10, "1": 7}
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(_FILL, {"rows": 5, "batch": 4, "shard": 0})
            conn.execute(_FILL, {"rows": 4, "batch": 5, "shard": 1})
            conn.execute("UPDATE outboxkit.relay_lease SET holder = NULL")  # shard 0 released
        await reads.until_count()
        assert reads.only == [None, [0]]
        assert _series(metrics.backlog) == {"0": 15, "1": 7}  # shard 1 not walked again
