"""A stop does not wait for a Kafka call that cannot succeed (Kafka refusing the relay's login).

Such a call answers only when its timeout ends (``kafka_timeout``, up to 300 s): the producer's
``init_transactions`` once a shard's lease is held, the checkpoint topic's metadata at start-up.
The relay waited for it before it stopped, holding the lease all along; and a librdkafka call
runs in a worker thread, which the process waits for before it exits. The fault test
``tests/fault/test_relay_stop_refused_login.py`` shows the same against a real SASL_SSL broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

import pytest

from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.runner import Relay
from outboxkit.settings import KafkaSettings, load_settings
from tests.relay_support import shard_worker

pytestmark = pytest.mark.unit

GUARD = 10.0  # seconds: a stop that does not wait is done in well under one


class _Leases:
    """Every attempt succeeds; releases are recorded."""

    def __init__(self) -> None:
        self.released: list[LeaseTerm] = []

    async def acquire(
        self,
        group: str,
        shard: int,
        holder: str,
        ttl: float,
        wake: asyncio.Event,
        *,
        level: int = logging.INFO,
    ) -> LeaseTerm:
        return LeaseTerm(group, shard, holder, 7, ttl, time.monotonic() + ttl)

    async def watch(self, term: LeaseTerm) -> None:
        await asyncio.Event().wait()  # the renewer: cancelled when the term ends

    async def release(self, term: LeaseTerm, *, level: int = logging.INFO) -> None:
        self.released.append(term)

    async def close(self) -> None:
        return None


class _NeverStarts:
    """A producer whose start never answers (its login refused, a timeout far away)."""

    def __init__(self) -> None:
        self.starting = asyncio.Event()
        self.closed = False

    async def start(self) -> None:
        self.starting.set()
        await asyncio.Event().wait()

    async def close(self) -> None:
        self.closed = True


async def _stopped_while(producer: _NeverStarts, checkpoints: object = None) -> list[LeaseTerm]:
    """A shard worker taking its lease with ``producer``, stopped once the producer is asked
    something that does not answer; the terms it released."""
    settings = load_settings(
        overrides={"database": {"url": "postgresql://relay@127.0.0.1:1/outbox"}, "relay": {}}
    )
    leases = _Leases()
    worker = shard_worker(settings, leases=leases)  # type: ignore[arg-type]
    worker._connect = contextlib.nullcontext  # type: ignore[method-assign,assignment]

    async def not_paused(conn: object, group: str) -> bool:
        return False

    async def no_earlier_slots(conn: object, term: object, slots: int) -> int:
        return slots

    worker._store.paused = not_paused  # type: ignore[method-assign]
    worker._store.raise_producer_slots = no_earlier_slots  # type: ignore[method-assign,assignment]
    worker._checkpoints = checkpoints  # type: ignore[assignment]
    worker._producer_factory = lambda shard, slot: producer  # type: ignore[assignment,return-value]
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(producer.starting.wait(), GUARD)
        worker.stop.set()
        await asyncio.wait_for(asyncio.shield(running), GUARD)
    finally:
        running.cancel()
    return leases.released


async def test_a_stop_while_a_producer_starts_releases_the_lease() -> None:
    producer = _NeverStarts()
    assert [term.token for term in await _stopped_while(producer)] == [7]
    assert producer.closed


async def test_a_stop_while_the_start_up_asks_kafka_ends_the_start_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = load_settings(
        overrides={
            "database": {"url": "postgresql://relay@127.0.0.1:1/outbox"},
            "kafka": {"bootstrap": "127.0.0.1:1"},
        }
    )
    asked = asyncio.Event()

    async def no_answer(self: Relay, shards: list[int]) -> None:
        asked.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(Relay, "_check_schema", lambda self: 1)
    monkeypatch.setattr(Relay, "_checkpoints", no_answer)
    relay = Relay(settings)
    starting = asyncio.create_task(relay._start_up())
    try:
        await asyncio.wait_for(asked.wait(), GUARD)
        relay.stop.set()
        assert await asyncio.wait_for(asyncio.shield(starting), GUARD) is None
    finally:
        starting.cancel()


def test_a_cancelled_init_transactions_ends_its_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process's exit waits for the thread: it must end soon after the call is given up."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError, KafkaException

    from outboxkit.kafka import confluent_producer
    from outboxkit.kafka.confluent_producer import ConfluentTransactionalProducer

    blocking = threading.Event()
    answered = threading.Event()  # set when the test ends: no call blocks beyond it

    class Refused:
        """librdkafka's producer while its login is refused: init answers at its timeout."""

        def __init__(self, config: dict[str, Any]) -> None:
            return None

        def init_transactions(self, seconds: float) -> None:
            blocking.set()
            answered.wait(seconds)
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True))

        def purge(self) -> None:
            return None

        def flush(self, seconds: float = 0) -> int:
            return 0

    monkeypatch.setattr(confluent_producer, "Producer", Refused)

    async def given_up() -> None:
        producer = ConfluentTransactionalProducer(
            KafkaSettings(bootstrap="127.0.0.1:1"), transactional_id="t", timeout=300.0
        )
        start = asyncio.ensure_future(producer.start())
        await asyncio.to_thread(blocking.wait, GUARD)
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await start
        await producer.close()

    # asyncio.run returns once its worker threads ended (as the relay process exits).
    running = threading.Thread(target=asyncio.run, args=(given_up(),), daemon=True)
    try:
        running.start()
        running.join(GUARD)
        assert blocking.is_set()
        assert not running.is_alive(), "the given-up init_transactions still runs"
    finally:
        answered.set()
        running.join(GUARD)


async def test_an_outer_cancellation_during_the_tasks_clean_up_is_not_swallowed() -> None:
    """The stop cancels the task; the caller is cancelled while the task cleans up: the
    caller's cancellation goes on (before, it was taken for the task's and swallowed)."""
    from outboxkit.relay.waiting import finished_unless

    stop, cleaning, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cleaning.set()
            await release.wait()
            raise

    task = asyncio.ensure_future(slow())
    outer = asyncio.ensure_future(finished_unless(task, stop))
    await asyncio.sleep(0)
    stop.set()
    await cleaning.wait()
    outer.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await outer


async def test_a_fatal_error_is_not_called_again_whatever_its_code() -> None:
    """A fatal error (or one that needs the transaction aborted) with a timeout's code is
    raised at once, not called again until the deadline."""
    from confluent_kafka import KafkaError, KafkaException

    from outboxkit.kafka.confluent_build import in_slices

    calls: list[float] = []

    def fatal(seconds: float) -> None:
        calls.append(seconds)
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "fenced", fatal=True))

    with pytest.raises(KafkaException):
        await in_slices(fatal, 3.0)
    assert len(calls) == 1


async def test_a_task_not_begun_when_the_stop_is_already_set_never_runs() -> None:
    """A producer start created as the stop comes must not begin (its init could then run on
    after the lease went, and fence the standby that took the shard over)."""
    from outboxkit.relay.waiting import finished_unless

    ran: list[str] = []

    async def start() -> None:
        ran.append("started")

    stop = asyncio.Event()
    stop.set()
    assert not await finished_unless(asyncio.ensure_future(start()), stop)
    assert ran == []


class _AsksForever(_NeverStarts):
    """Starts; the question whether it may write the checkpoint topic never answers."""

    async def start(self) -> None:
        return None

    async def topic_problem(self, topic: str) -> None:
        self.starting.set()
        await asyncio.Event().wait()


async def test_a_stop_while_the_takeover_asks_about_the_checkpoint_topic_releases_the_lease() -> (
    None
):
    from outboxkit.relay.checkpoint import CheckpointTopic

    producer = _AsksForever()
    checkpoints = CheckpointTopic(None, "ckpt")  # type: ignore[arg-type]
    assert [term.token for term in await _stopped_while(producer, checkpoints)] == [7]
    assert producer.closed
