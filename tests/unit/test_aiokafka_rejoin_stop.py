"""An aiokafka consumer stopped while its group rejoins: a poll that ``getmany`` holds past its
wait, a ``stop()`` that waits for a JoinGroup the coordinator holds.

The objects stand in for aiokafka's consumer only where its behaviour is the input: a
``getmany`` that waits for the new assignment whatever its timeout, a coordinator whose close
waits for its coordination task, which waits for the JoinGroup answer (real-stack test:
``tests/fault/test_inbox_stop_during_rejoin.py``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.client import ConnectionGroup
from aiokafka.protocol.group import LeaveGroupRequest

from outboxkit.kafka import aiokafka_consumer, aiokafka_fetch, aiokafka_stop
from outboxkit.kafka.aiokafka_stop import stop_consumer
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit


class _Record:
    topic, partition, offset, key, value, headers, timestamp = "t", 0, 7, b"k", b"v", (), 1


class _Rebalancing:
    """``getmany`` held until the new assignment (``assigned``), then one record."""

    def __init__(self) -> None:
        self.assigned = asyncio.Event()
        self.calls = 0
        self.stopped = False

    async def getmany(self, timeout_ms: int, max_records: int) -> Any:
        self.calls += 1
        await self.assigned.wait()
        return {TopicPartition("t", 0): [_Record()]}

    async def stop(self) -> None:
        self.stopped = True


def _consumer(fake: Any) -> aiokafka_consumer.AiokafkaGroupConsumer:
    settings = KafkaSettings(bootstrap="127.0.0.1:1", client="aiokafka")
    consumer = aiokafka_consumer.AiokafkaGroupConsumer(settings, "g")
    consumer._consumer = fake
    return consumer


def test_a_poll_a_rebalance_holds_returns_and_the_next_one_takes_its_fetch_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aiokafka_fetch, "POLL_GRACE_SECONDS", 0.05)

    async def scenario() -> None:
        fake = _Rebalancing()
        consumer = _consumer(fake)
        began = time.monotonic()
        assert await consumer.poll(0.05, 10) == []
        assert time.monotonic() - began < 1
        fake.assigned.set()
        records = await consumer.poll(0.05, 10)
        assert [(r.partition, r.offset) for r in records] == [(0, 7)]
        assert fake.calls == 1  # the held fetch, not a new one: nothing fetched is dropped
        assert consumer.handed == {("t", 0): 8}

    asyncio.run(scenario())


def test_a_close_cancels_a_held_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiokafka_fetch, "POLL_GRACE_SECONDS", 0.05)

    async def scenario() -> None:
        fake = _Rebalancing()
        consumer = _consumer(fake)
        assert await consumer.poll(0.05, 10) == []
        held = consumer._fetch._future
        await consumer.close()
        assert held is not None
        assert held.cancelled()
        assert fake.stopped

    asyncio.run(scenario())


class _Coordinator:
    group_id, member_id, coordinator_id = "g", "member-1", 3

    def __init__(self, joining: bool) -> None:
        self._performed_join_prepare = joining
        self._closing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.join: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def close(self) -> None:
        self._closing.set_result(None)
        await self.join  # the coordination task, waiting for the JoinGroup answer


class _Client:
    def __init__(self, coordinator: _Coordinator) -> None:
        self.coordinator = coordinator
        self.sent: list[tuple[int, Any, ConnectionGroup, bool]] = []

    async def send(self, node: int, request: Any, *, group: ConnectionGroup) -> None:
        self.sent.append((node, request, group, self.coordinator._closing.done()))
        if not self.coordinator.join.done():  # answered: UNKNOWN_MEMBER_ID
            self.coordinator.join.set_result(None)


class _Joining:
    def __init__(self, joining: bool) -> None:
        self._coordinator = _Coordinator(joining)
        self._client = _Client(self._coordinator)

    async def stop(self) -> None:
        await self._coordinator.close()


def test_a_stop_during_a_rejoin_leaves_over_another_connection_once_closing() -> None:
    async def scenario() -> None:
        consumer: Any = _Joining(joining=True)
        await asyncio.wait_for(stop_consumer(consumer), 5)
        ((node, request, group, closing),) = consumer._client.sent
        assert (node, group, closing) == (3, ConnectionGroup.DEFAULT, True)
        assert isinstance(request, LeaveGroupRequest)

    asyncio.run(scenario())


def test_a_stop_outside_a_rejoin_leaves_as_aiokafka_does() -> None:
    async def scenario() -> None:
        consumer: Any = _Joining(joining=False)
        stopping = asyncio.ensure_future(stop_consumer(consumer))
        await asyncio.sleep(0.05)
        assert not stopping.done()
        assert consumer._client.sent == []
        consumer._coordinator.join.set_result(None)
        await stopping

    asyncio.run(scenario())


def test_a_rejoin_that_begins_after_the_stop_is_left_too() -> None:
    """A revocation still committing as the stop begins: its JoinGroup goes out all the same."""

    async def scenario() -> None:
        consumer: Any = _Joining(joining=False)
        stopping = asyncio.ensure_future(stop_consumer(consumer))
        await asyncio.sleep(0.05)
        consumer._coordinator._performed_join_prepare = True
        await asyncio.wait_for(stopping, 5)
        assert len(consumer._client.sent) == 1

    asyncio.run(scenario())


def test_a_static_member_never_leaves_on_a_stop() -> None:
    """aiokafka's own rule (its restart takes its place back without a rebalance): the stop
    waits for the rejoin's answer, as before."""

    async def scenario() -> None:
        consumer: Any = _Joining(joining=True)
        consumer._coordinator._group_instance_id = "static-1"
        stopping = asyncio.ensure_future(stop_consumer(consumer))
        await asyncio.sleep(3 * aiokafka_stop.JOIN_CHECK_SECONDS)  # checked meanwhile
        assert not stopping.done()
        consumer._coordinator.join.set_result(None)
        await asyncio.wait_for(stopping, 5)
        assert consumer._client.sent == []

    asyncio.run(scenario())
