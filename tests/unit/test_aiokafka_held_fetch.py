"""A ``getmany`` a poll left running (a rebalance held it past the poll's wait), taken over by
the next poll: what it handed out before the loop sought, paused or the group rebalanced is not
handed on (the real-stack stop: ``tests/fault/test_inbox_stop_during_rejoin.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import TopicPartition

from outboxkit.kafka import aiokafka_fetch
from outboxkit.kafka.aiokafka_fetch import HeldFetch

pytestmark = pytest.mark.unit

TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


class _Record:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class _Client:
    """``getmany`` waits until ``release``, then hands out records 5-6 of both partitions."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.sought: list[tuple[TopicPartition, int]] = []

    async def getmany(self, timeout_ms: int, max_records: int) -> Any:
        await self.release.wait()
        return {TP0: [_Record(5), _Record(6)], TP1: [_Record(5), _Record(6)]}

    def assignment(self) -> set[TopicPartition]:
        return {TP0, TP1}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.sought.append((tp, offset))


def _run(
    monkeypatch: pytest.MonkeyPatch,
    between: Callable[[HeldFetch, _Client, list[int]], Awaitable[None]],
) -> tuple[dict[TopicPartition, list[int]], list[tuple[TopicPartition, int]]]:
    """A poll returns with the fetch held; ``between`` runs (the fetch may hand out first);
    the next poll takes it over: what it hands on, and the seeks it made."""
    monkeypatch.setattr(aiokafka_fetch, "POLL_GRACE_SECONDS", 0.01)

    async def scenario() -> tuple[dict[TopicPartition, list[int]], list[Any]]:
        client, generation = _Client(), [0]
        fetch = HeldFetch(lambda: generation[0])
        assert await fetch.poll(client, 0.01, 10) == {}  # type: ignore[arg-type]
        await between(fetch, client, generation)
        client.release.set()
        batches = await fetch.poll(client, 0.01, 10)  # type: ignore[arg-type]
        return {tp: [r.offset for r in rs] for tp, rs in batches.items()}, client.sought

    return asyncio.run(scenario())


async def _handed_out(client: _Client) -> None:
    client.release.set()
    await asyncio.sleep(0)  # the fetch's task ends: its records are handed out now
    await asyncio.sleep(0)


def test_nothing_moved_everything_is_handed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    async def nothing(fetch: HeldFetch, client: _Client, generation: list[int]) -> None:
        await _handed_out(client)

    assert _run(monkeypatch, nothing) == ({TP0: [5, 6], TP1: [5, 6]}, [])


def test_a_partition_sought_after_the_hand_out_is_dropped_and_keeps_its_seek(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def seek(fetch: HeldFetch, client: _Client, generation: list[int]) -> None:
        await _handed_out(client)
        fetch.moved([TP0], sought=True)  # the gate sought back to a held record

    assert _run(monkeypatch, seek) == ({TP1: [5, 6]}, [])


def test_a_partition_paused_after_the_hand_out_is_dropped_and_sought_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def pause(fetch: HeldFetch, client: _Client, generation: list[int]) -> None:
        await _handed_out(client)
        fetch.moved([TP1], sought=False)

    assert _run(monkeypatch, pause) == ({TP0: [5, 6]}, [(TP1, 5)])


def test_moves_before_the_hand_out_drop_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiokafka checked those itself when it handed the records out."""

    async def before(fetch: HeldFetch, client: _Client, generation: list[int]) -> None:
        fetch.moved([TP0], sought=True)
        fetch.moved([TP1], sought=False)
        generation[0] += 2

    assert _run(monkeypatch, before) == ({TP0: [5, 6], TP1: [5, 6]}, [])


def test_a_rebalance_after_the_hand_out_drops_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    async def rebalance(fetch: HeldFetch, client: _Client, generation: list[int]) -> None:
        await _handed_out(client)
        generation[0] += 2  # revoked, assigned: aiokafka starts from the committed offsets

    assert _run(monkeypatch, rebalance) == ({}, [])


def test_a_fetch_the_close_cancels_under_a_waiting_poll_hands_out_nothing() -> None:
    async def scenario() -> Any:
        fetch = HeldFetch(lambda: 0)
        waiting = asyncio.ensure_future(fetch.poll(_Client(), 5, 10))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        held = fetch.take()
        assert held is not None
        held.cancel()
        return await waiting

    assert asyncio.run(scenario()) == {}


def test_a_seek_then_a_pause_after_the_hand_out_keeps_the_seek(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A retry's hold (``settle``: Seek, then Pause): the pause must not seek back over it."""

    async def hold(fetch: HeldFetch, client: _Client, generation: list[int]) -> None:
        await _handed_out(client)
        fetch.moved([TP0], sought=True)
        fetch.moved([TP0], sought=False)

    assert _run(monkeypatch, hold) == ({TP1: [5, 6]}, [])


def test_a_seek_before_and_a_pause_after_the_hand_out_is_sought_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def hold(fetch: HeldFetch, client: _Client, generation: list[int]) -> None:
        fetch.moved([TP0], sought=True)
        await _handed_out(client)
        fetch.moved([TP0], sought=False)

    assert _run(monkeypatch, hold) == ({TP1: [5, 6]}, [(TP0, 5)])


def test_a_poll_whose_fetch_a_close_took_hands_out_nothing_and_keeps_the_next_fetch() -> None:
    """A close (then a new client's poll) while a poll waits: that poll hands out nothing of the
    closed client's, and leaves the new fetch in place."""

    async def scenario() -> tuple[Any, bool]:
        fetch, old, new = HeldFetch(lambda: 0), _Client(), _Client()
        waiting = asyncio.ensure_future(fetch.poll(old, 5, 10))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        taken = fetch.take()
        assert taken is not None
        old.release.set()  # it ends by itself before the close could cancel it
        newer = asyncio.ensure_future(fetch.poll(new, 5, 10))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        found = await waiting
        held = fetch._future is not None
        new.release.set()
        await newer
        return found, held

    assert asyncio.run(scenario()) == ({}, True)


class _Seeking:
    """The aiokafka client under ``AiokafkaGroupConsumer``'s seek and pause."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def assignment(self) -> set[TopicPartition]:
        return {TP0, TP1}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.calls.append(f"seek {tp.partition} {offset}")

    def pause(self, *tps: TopicPartition) -> None:
        self.calls.append("pause " + " ".join(str(tp.partition) for tp in tps))


def test_the_consumers_seek_and_pause_are_counted_as_moves() -> None:
    from outboxkit.kafka.aiokafka_consumer import AiokafkaGroupConsumer
    from outboxkit.settings import KafkaSettings

    consumer = AiokafkaGroupConsumer(KafkaSettings(bootstrap="127.0.0.1:1"), "g")
    consumer._consumer = _Seeking()  # type: ignore[assignment]
    loop = asyncio.new_event_loop()
    consumer._fetch._future = loop.create_future()  # a fetch in flight
    consumer.seek(("t", 0), 3)
    consumer.pause([("t", 1)])
    loop.close()
    moved = consumer._fetch._moved
    assert set(moved) == {TP0, TP1}
    assert moved[TP0][1] == moved[TP0][0]  # sought
    assert moved[TP1][1] == 0  # only paused
