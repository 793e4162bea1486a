"""LISTEN/NOTIFY is a hint that wakes the right shard early; polling alone finds everything."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import psycopg
import pytest

from outboxkit.relay import shard_worker
from outboxkit.relay.notify import listen_forever
from outboxkit.relay.waiting import wait_any
from outboxkit.schema import notify_channel
from tests.relay_support import (
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
    set_shard_count,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]


def _insert_and_notify(db_url: str, topic: str, key: str) -> int:
    with psycopg.connect(db_url) as conn:  # one transaction: rows and the hint commit together
        (row_id,) = insert_rows(conn, topic, payloads(key, 1))
        shard = conn.execute(
            "SELECT shard FROM outboxkit.outbox_message WHERE id = %s", (row_id,)
        ).fetchone()
        assert shard is not None
        conn.execute("SELECT pg_notify(%s, %s)", (notify_channel("outboxkit"), str(shard[0])))
    return int(shard[0])


def _listening(db_url: str) -> bool:
    """The relay's LISTEN has run: its session's last statement is the LISTEN."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'outboxkit-relay-listen' AND state = 'idle'"
            " AND query ILIKE 'LISTEN%%'"
        ).fetchone()
    return row is not None and row[0] > 0


class _LongIdleWaits:
    """Stands in for the shard workers' ``wait_any``: once ``wakes`` is filled, an idle wait
    (one a hint can end) lasts ``seconds``, as after a long idle spell (the real one starts at
    50 ms and doubles up to the poll interval), so only a wake-up ends it within a test."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.wakes: set[asyncio.Event] = set()
        self.pending: set[asyncio.Event] = set()  # wakes whose worker is in a long idle wait
        self.woken: list[asyncio.Event] = []  # long idle waits that a wake-up ended

    async def __call__(self, events: Sequence[asyncio.Event], seconds: float) -> None:
        wake = next((event for event in events if event in self.wakes), None)
        if wake is None:
            await wait_any(events, seconds)
            return
        self.pending.add(wake)
        try:
            await wait_any(events, self.seconds)
        finally:
            self.pending.discard(wake)
        if wake.is_set():
            self.woken.append(wake)


async def test_notify_wakes_the_shard_worker(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both workers sit in idle waits of the whole poll interval (600 s) when the row and its
    hint commit: the row is published long before, and only its shard's wait was cut short."""
    topic = outboxkit_topic()
    set_shard_count(outboxkit_db_url, 2)
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, poll_interval=600.0)
    idle = _LongIdleWaits(settings.relay.poll_interval)
    monkeypatch.setattr(shard_worker, "wait_any", idle)
    async with running_relay(settings) as relay:
        await wait_for_async(lambda: all(w.active.is_set() for w in relay.workers.values()))
        await wait_for_async(lambda: _listening(outboxkit_db_url))  # a NOTIFY before is lost
        idle.wakes = {w.wake for w in relay.workers.values()}
        await wait_for_async(lambda: idle.pending == idle.wakes, what="long idle waits")
        woken_before = len(idle.woken)  # the listener's start-up hint may have woken both
        shard = _insert_and_notify(outboxkit_db_url, topic, "k")
        await wait_for_async(lambda: row_states(outboxkit_db_url) == {"published": 1})
        assert idle.woken[woken_before:] == [relay.workers[shard].wake]
        assert relay.workers[shard].notifications >= 1
        assert relay.workers[1 - shard].notifications == 0


async def test_no_listen_mode_publishes_by_polling(
    outboxkit_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory
) -> None:
    topic = outboxkit_topic()
    settings = relay_settings(outboxkit_db_url, outboxkit_kafka_bootstrap, listen=False)
    async with running_relay(settings) as relay:
        _insert_and_notify(outboxkit_db_url, topic, "k")
        insert_rows(outboxkit_db_url, topic, payloads("j", 3))
        await wait_for_async(lambda: row_states(outboxkit_db_url) == {"published": 4})
        assert all(w.notifications == 0 for w in relay.workers.values())


def _listen_connections(db_url: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'outboxkit-relay-listen'"
        ).fetchone()
    return 0 if row is None else int(row[0])


async def test_a_listener_stopped_then_cancelled_during_a_hint_closes_its_connection(
    outboxkit_db_url: str,
) -> None:
    """The relay's shutdown sets ``stop`` and then cancels the listener. Here both come as a hint
    arrives: the listener leaves its loop and closes its connection before the cancellation
    lands (it has no await left to land in), so the task ends by itself and nothing is left
    open. Had the connection's exit waited (psycopg's own ``async with`` commits first, behind
    the lock of a ``notifies()`` generator not yet closed), the cancellation would land there
    and skip the close."""
    stop = asyncio.Event()
    hints: list[int | None] = []
    tasks: list[asyncio.Task[None]] = []

    def on_notify(shard: int | None) -> None:
        hints.append(shard)
        if shard == 5:
            stop.set()
            asyncio.get_running_loop().call_soon(tasks[0].cancel)

    tasks.append(
        asyncio.create_task(listen_forever(outboxkit_db_url, "outboxkit", on_notify, stop))
    )
    await wait_for_async(lambda: _listening(outboxkit_db_url), what="the LISTEN")
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, '5')", (notify_channel("outboxkit"),))
    await asyncio.wait_for(tasks[0], timeout=30)  # ended by itself: not cancelled
    assert hints == [None, 5]
    await wait_for_async(
        lambda: _listen_connections(outboxkit_db_url) == 0, what="the listen connection gone"
    )
