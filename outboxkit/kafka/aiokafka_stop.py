"""Stopping an aiokafka client while Kafka is away: a consumer's ``stop()``, finished, a
bounded offset commit, and a producer whose queued records are given up.

``AIOKafkaConsumer.stop()`` closes its fetcher, which cancels each pending fetch task and
awaits it. A fetch that failed while Kafka is away waits out its retry back-off outside the
``except CancelledError`` that ends a cancelled one quietly, so awaiting it re-raises the
cancellation: ``stop()`` raised ``CancelledError`` without our task being cancelled, and never
closed its client (its connections stayed open). ``outboxkit inbox run`` stopped by SIGTERM
during an outage exited with status 1, a traceback and an unclosed producer.

aiokafka's ``commit()`` waits for a group coordinator for as long as there is none: during an
outage a commit (the one a close makes too) held the consumer, and a stop, until Kafka came
back. :func:`commit` gives up once no coordinator has been known for a while, or at the request
timeout.

A stop during a rejoin waited for the coordinator's answer to the JoinGroup, held for the
slowest member: the member now leaves the group first (:func:`_stop_leaving`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.client import ConnectionGroup
from aiokafka.errors import KafkaError
from aiokafka.protocol.group import LeaveGroupRequest

from outboxkit.errors import PublishError, named
from outboxkit.futures import retrieved

logger = logging.getLogger("outboxkit.kafka.consumer")

#: aiokafka's own default for ``request_timeout_ms``: a commit's bound unless one is set.
DEFAULT_REQUEST_TIMEOUT_MS = 40_000
#: How often a waiting commit looks whether aiokafka still knows a coordinator, and how long
#: it may know none before the commit fails.
COORDINATOR_CHECK_SECONDS = 0.1
COORDINATOR_GRACE_SECONDS = 2.0
#: How often a stop looks whether the closing consumer's rejoin waits at the coordinator.
JOIN_CHECK_SECONDS = 0.1


async def stop_consumer(
    consumer: AIOKafkaConsumer, polling: asyncio.Future[Any] | None = None
) -> None:
    """``consumer.stop()`` (``polling``, a ``getmany`` a poll left running, cancelled first);
    should it raise a cancellation that is not this task's, the rest of the stop (its fetches,
    its client) is done here."""
    if polling is not None:  # what it fetched is not handed out: the next owner fetches it
        polling.add_done_callback(retrieved)
        polling.cancel()
        await asyncio.wait([polling])
    try:
        await _stop_leaving(consumer)
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # our own cancellation
        logger.info("consumer stop: one of aiokafka's tasks was cancelled; closing the client")
        fetcher: Any = getattr(consumer, "_fetcher", None)
        tasks = [getattr(fetcher, "_fetch_task", None), *getattr(fetcher, "_pending_tasks", ())]
        running = [t for t in tasks if isinstance(t, asyncio.Future) and not t.done()]
        for fetch in running:
            fetch.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        client: Any = getattr(consumer, "_client", None)
        if client is not None:
            await client.close()


async def _stop_leaving(consumer: AIOKafkaConsumer) -> None:
    """``consumer.stop()``, which waits for its coordination task to end: during a rejoin
    that task waits for the answer to its JoinGroup (or SyncGroup), which the coordinator
    holds until every member rejoined or the group's rebalance timeout (the longest of the
    members'), say for a member that is frozen. So once the stop has begun (its task will not
    join again), the member leaves the group over another connection (the coordinator answers
    one request of a connection at a time): the coordinator answers the held request at once
    (UNKNOWN_MEMBER_ID), and the stop ends. Leaving, not abandoning the request: the others
    need not wait out a session timeout for this member. What was settled before the rejoin
    was committed by the revocation that began it. The stop ends when aiokafka's does: a
    leave still unanswered then is cancelled."""
    stopping = asyncio.ensure_future(consumer.stop())
    leaving: asyncio.Future[None] | None = None
    try:
        # Watched until it ends: a revocation still committing as the stop begins is followed
        # by a JoinGroup all the same.
        while not stopping.done():
            if leaving is None and _joining(consumer):
                leaving = asyncio.ensure_future(_leave(consumer))
                leaving.add_done_callback(retrieved)  # whatever ends it, the stop goes on
            await asyncio.wait([stopping], timeout=JOIN_CHECK_SECONDS)
    except BaseException:  # our own cancellation: it cancels the stop, as awaiting it would
        stopping.cancel()
        raise
    finally:
        if leaving is not None and not leaving.done():
            leaving.cancel()
            await asyncio.wait([leaving])
    await stopping


def _joining(consumer: AIOKafkaConsumer) -> bool:
    """Whether a JoinGroup/SyncGroup of the closing coordinator is in flight, or about to be
    (its revocation, which commits, is done). Not yet closing, it would join again once
    answered."""
    coordinator: Any = getattr(consumer, "_coordinator", None)
    closing = getattr(coordinator, "_closing", None)
    return (
        # A static member never leaves on a stop (aiokafka's own rule; its LeaveGroup versions
        # cannot name the instance): its restart takes its place back without a rebalance.
        getattr(coordinator, "_group_instance_id", None) is None
        and getattr(coordinator, "_performed_join_prepare", False) is True
        and bool(getattr(coordinator, "member_id", ""))
        and getattr(coordinator, "coordinator_id", None) is not None
        and isinstance(closing, asyncio.Future)
        and closing.done()
    )


async def _leave(consumer: AIOKafkaConsumer) -> None:
    """LeaveGroup over the client's other connection to the coordinator. A failure is logged:
    the stop then waits for the rejoin's answer, as before."""
    coordinator: Any = getattr(consumer, "_coordinator", None)
    client: Any = getattr(consumer, "_client", None)
    logger.info("consumer stop: its rejoin waits at the coordinator; leaving the group")
    request = LeaveGroupRequest(coordinator.group_id, coordinator.member_id)
    try:
        answer = await client.send(
            coordinator.coordinator_id, request, group=ConnectionGroup.DEFAULT
        )
    except KafkaError as exc:
        logger.info("consumer stop: leaving the group during its rejoin failed: %s", exc)
        return
    if (code := getattr(answer, "error_code", 0)) != 0:
        logger.info("consumer stop: leaving the group during its rejoin refused (error %s)", code)


def _coordinator_unknown(consumer: AIOKafkaConsumer) -> bool:
    coordinator: Any = getattr(consumer, "_coordinator", None)
    return coordinator is not None and getattr(coordinator, "coordinator_id", 0) is None


def _orphans_retrieved() -> None:
    """aiokafka sends a commit's request in a shielded task of its own: once the commit is
    cancelled, nothing would read that task's failure, which asyncio then reports as an ERROR
    with a traceback ("exception was never retrieved")."""
    for task in asyncio.all_tasks():
        if getattr(task.get_coro(), "__qualname__", "") == "GroupCoordinator._do_commit_offsets":
            task.add_done_callback(retrieved)


async def commit(
    consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int], request_timeout_ms: int
) -> None:
    """``offsets`` committed; a :class:`PublishError` once no group coordinator has been known
    for :data:`COORDINATOR_GRACE_SECONDS` (Kafka away: aiokafka forgets the coordinator at the
    first failed request, and finds a moved one again well within that), or at the request
    timeout. The offsets stay pending; a redelivery is recognised."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request_timeout_ms / 1000
    unknown_since: float | None = None
    task = asyncio.ensure_future(consumer.commit(offsets))
    try:
        while not task.done():
            now = loop.time()
            if not _coordinator_unknown(consumer):
                unknown_since = None
            elif unknown_since is None:
                unknown_since = now
            elif now - unknown_since >= COORDINATOR_GRACE_SECONDS:
                raise PublishError("offset commit failed: no group coordinator (Kafka away?)")
            if now >= deadline:
                raise PublishError(
                    f"offset commit failed: not answered within {request_timeout_ms / 1000:g} s"
                )
            await asyncio.wait([task], timeout=min(deadline - now, COORDINATOR_CHECK_SECONDS))
    finally:
        if not task.done():
            task.cancel()
            _orphans_retrieved()
            await asyncio.wait([task])  # its clean-up; our own cancellation still propagates
        elif not task.cancelled():
            task.exception()  # read, should our own cancellation come with it
    try:
        task.result()
    except KafkaError as exc:
        raise PublishError(f"offset commit failed: {named(exc)}") from exc


async def abandon_producer(producer: AIOKafkaProducer, seconds: float) -> None:
    """Close ``producer`` without delivering the record it holds. Its ``stop()`` first waits for
    every queued record, which an idempotent producer retries for as long as Kafka is away, and
    a stop cut short cannot be run again (its sender and connections kept retrying). So its
    sender task is cancelled, which lets the requests in flight end (at most ``seconds`` are
    waited for), and its client is closed, which ends them if they have not. A request that
    then waits for a metadata update (after a connection timed out) would wait for ever, its
    updater gone with the client: it is told the update failed, and gets ``seconds`` more."""
    found = getattr(getattr(producer, "_sender", None), "sender_task", None)
    task = found if isinstance(found, asyncio.Task) and not found.done() else None
    client = producer.client
    try:
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=seconds)
    finally:
        try:
            await asyncio.wait_for(client.close(), seconds)
        finally:
            producer._closed = True  # closed: a stop() of it is a no-op, no "unclosed" warning
            update = getattr(client, "_md_update_fut", None)
            if isinstance(update, asyncio.Future) and not update.done():
                update.set_result(False)
    if task is not None and not task.done():
        # Its first cancellation went into the sender's wait for its own tasks; a transaction's
        # commit or abort among them waits for batches nothing will now complete.
        task.cancel()
        await asyncio.wait([task], timeout=seconds)
    _transaction_error_retrieved(producer)


def _transaction_error_retrieved(producer: AIOKafkaProducer) -> None:
    """A transaction error the abandoned producer's sender left (ProducerFenced, once the next
    producer fenced it) is taken as retrieved: nothing of this producer awaits it any more."""
    manager: Any = getattr(producer, "_txn_manager", None)
    waiter = getattr(manager, "_transaction_waiter", None)
    if isinstance(waiter, asyncio.Future):
        waiter.add_done_callback(retrieved)


def _holds_batches(producer: AIOKafkaProducer) -> bool:
    """Whether records are queued, or sent and unanswered: a ``stop()`` would wait for them."""
    accumulator: Any = getattr(producer, "_message_accumulator", None)
    queued = getattr(accumulator, "_batches", None)
    sent = getattr(accumulator, "_pending_batches", None)
    return bool(queued and any(queued.values())) or bool(sent)


async def stop_or_abandon(producer: AIOKafkaProducer, seconds: float) -> None:
    """``producer.stop()`` within ``seconds``, else :func:`abandon_producer`: a stop cut short
    left its sender retrying the queued batches (an idempotent producer retries for as long as
    they cannot be written: a broker away, NOT_ENOUGH_REPLICAS), and they landed once Kafka took
    them, after newer rows of their keys that the next producer had sent (a 3-broker cluster
    with its in-sync replicas below the minimum for 80 s: 2,639 records landed late, and the
    last copy of a row came after newer rows of its key). A producer that still holds records
    (the relay gave up on them: its send failed or timed out) is abandoned at once: a stop that
    had begun to flush them would leave that flush waiting for ever."""
    if _holds_batches(producer):
        await abandon_producer(producer, seconds)
        return
    try:
        await asyncio.wait_for(producer.stop(), seconds)
    except (KafkaError, TimeoutError, OSError):
        await abandon_producer(producer, seconds)
