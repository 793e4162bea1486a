"""An aiokafka consumer's stop and offset commit while Kafka is away (``aiokafka_stop``).

The objects stand in for aiokafka's consumer only where its behaviour is the input: a ``stop()``
that raises a fetch's cancellation (aiokafka's fetcher re-raises it when the fetch was in its
retry back-off), a coordinator that is forgotten while a commit waits.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from outboxkit.errors import PublishError
from outboxkit.kafka.aiokafka_stop import commit, stop_consumer

pytestmark = pytest.mark.unit


class _Client:
    def __init__(self) -> None:
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class _Fetcher:
    def __init__(self, pending: list[asyncio.Task[None]]) -> None:
        self._pending_tasks = set(pending)


class _StopRaisesAFetchsCancellation:
    """aiokafka's stop as it ends while Kafka is away: the first fetch task it cancels and
    awaits re-raises the cancellation, so the others and the client are left."""

    def __init__(self, fetches: list[asyncio.Task[None]]) -> None:
        self._fetcher = _Fetcher(fetches)
        self._client = _Client()
        self.first = fetches[0]

    async def stop(self) -> None:
        self.first.cancel()
        await self.first  # raises CancelledError in the stopping task


async def _backing_off() -> None:
    await asyncio.sleep(3600)


def test_a_fetchs_cancellation_out_of_stop_is_not_ours_and_the_stop_is_finished() -> None:
    async def scenario() -> tuple[bool, list[bool]]:
        fetches = [asyncio.ensure_future(_backing_off()) for _ in range(2)]
        await asyncio.sleep(0)
        consumer: Any = _StopRaisesAFetchsCancellation(fetches)
        await stop_consumer(consumer)  # no CancelledError
        return consumer._client.closed, [f.cancelled() for f in fetches]

    closed, cancelled = asyncio.run(scenario())
    assert closed
    assert cancelled == [True, True]


def test_our_own_cancellation_during_the_stop_still_propagates() -> None:
    async def scenario() -> bool:
        consumer: Any = _StopRaisesAFetchsCancellation([asyncio.ensure_future(_backing_off())])
        consumer.stop = _backing_off  # a stop still running when we are cancelled
        task = asyncio.ensure_future(stop_consumer(consumer))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return bool(consumer._client.closed)

    assert asyncio.run(scenario()) is False


class _Coordinator:
    coordinator_id: int | None = 1


class _Committing:
    """A consumer whose commit waits for a coordinator for as long as there is none, then sends
    its request in a shielded task of its own, as aiokafka's does."""

    def __init__(self) -> None:
        self._coordinator = _Coordinator()
        self.requests: list[asyncio.Future[None]] = []
        self.sent = asyncio.Event()

    async def commit(self, offsets: dict[Any, int]) -> None:
        await asyncio.shield(GroupCoordinator()._do_commit_offsets(self))


class GroupCoordinator:
    """Named as aiokafka's: its request task is found by its coroutine's name."""

    async def _do_commit_offsets(self, consumer: _Committing) -> None:
        answered = asyncio.get_running_loop().create_future()
        consumer.requests.append(answered)
        consumer.sent.set()
        await answered


def _unretrieved(loop: asyncio.AbstractEventLoop) -> list[str]:
    reported: list[str] = []
    loop.set_exception_handler(lambda _, context: reported.append(context["message"]))
    return reported


def test_a_commit_fails_once_the_coordinator_stays_forgotten() -> None:
    async def scenario() -> tuple[str, list[str]]:
        reported = _unretrieved(asyncio.get_running_loop())
        consumer: Any = _Committing()
        task = asyncio.ensure_future(commit(consumer, {}, 60_000))
        await consumer.sent.wait()
        consumer._coordinator.coordinator_id = None  # a request failed: Kafka away
        with pytest.raises(PublishError) as raised:
            await asyncio.wait_for(task, 10)
        consumer.requests[0].set_exception(ConnectionError("closed"))  # the request ends later
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        gc.collect()
        return str(raised.value), reported

    text, reported = asyncio.run(scenario())
    assert text == "offset commit failed: no group coordinator (Kafka away?)"
    assert reported == []  # the request's late failure is not "never retrieved"


def test_a_coordinator_forgotten_for_a_moment_does_not_fail_the_commit() -> None:
    async def scenario() -> None:
        consumer: Any = _Committing()
        task = asyncio.ensure_future(commit(consumer, {}, 60_000))
        await consumer.sent.wait()
        consumer._coordinator.coordinator_id = None  # moving to another broker
        await asyncio.sleep(0.3)
        consumer._coordinator.coordinator_id = 2
        consumer.requests[0].set_result(None)
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())


def test_a_commit_without_an_answer_fails_at_the_request_timeout() -> None:
    async def scenario() -> str:
        consumer: Any = _Committing()
        with pytest.raises(PublishError) as raised:
            await commit(consumer, {}, 200)
        return str(raised.value)

    assert asyncio.run(scenario()) == "offset commit failed: not answered within 0.2 s"


def test_a_commit_that_is_answered_returns() -> None:
    async def scenario() -> None:
        consumer: Any = _Committing()
        task = asyncio.ensure_future(commit(consumer, {}, 60_000))
        await consumer.sent.wait()
        consumer.requests[0].set_result(None)
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
