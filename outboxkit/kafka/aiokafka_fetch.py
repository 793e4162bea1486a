"""aiokafka's ``getmany``, waited for at most a poll's wait.

During a rebalance ``getmany`` waits for the new assignment whatever its timeout, which held
the inbox loop, and so a stop, until the rejoin ended (as long as the group's rebalance
timeout). A poll now waits for it at most its wait plus :data:`POLL_GRACE_SECONDS` and returns
nothing; the fetch is not cancelled (aiokafka's fetch context has no ``finally``: a cancelled
``getmany`` would count as polling for ever and defeat ``max_poll_interval_ms``) but taken over
by the next poll.

aiokafka checks a partition's position, pause and assignment when ``getmany`` hands records
out. A held fetch may hand them out before the loop seeks, pauses or the group rebalances, and
be taken over after: those records are dropped then. A partition paused (not sought) is sought
back to its first dropped record, as its position had moved past them; a sought one keeps the
position it was sought to; after a rebalance aiokafka starts again from the committed offsets.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from outboxkit.futures import retrieved

#: How long past its ``wait`` a poll waits for ``getmany`` (which ends at that ``wait`` itself
#: unless a rebalance holds it) before it returns nothing.
POLL_GRACE_SECONDS = 0.5

Batches = dict[TopicPartition, list[Any]]


class HeldFetch:
    """One consumer client's ``getmany`` in flight, and what moved since it handed records out.
    ``generation`` is read when records are handed out: the owner bumps it in every rebalance
    callback."""

    def __init__(self, generation: Callable[[], int]) -> None:
        self._generation = generation
        self._future: asyncio.Future[tuple[Batches, int, int]] | None = None
        self._stamps = itertools.count(1)
        self._stamp = 0  # the last one given
        # per partition moved while a fetch was in flight: the stamps of its last move, last seek
        self._moved: dict[TopicPartition, tuple[int, int]] = {}

    def moved(self, tps: list[TopicPartition], *, sought: bool) -> None:
        """The loop sought or paused ``tps`` (only matters while a fetch is in flight)."""
        if self._future is not None:
            stamp = self._stamp = next(self._stamps)
            for tp in tps:
                self._moved[tp] = (stamp, stamp if sought else self._moved.get(tp, (0, 0))[1])

    def take(self) -> asyncio.Future[Any] | None:
        """The fetch in flight, handed to the close (which cancels it); none any more here."""
        future, self._future = self._future, None
        self._moved.clear()
        if future is not None:
            future.add_done_callback(retrieved)
        return future

    async def poll(self, consumer: AIOKafkaConsumer, wait: float, max_records: int) -> Batches:
        """The batches handed out, less what moved after; ``{}`` while still held (or cancelled
        by a close). Raises what ``getmany`` raised."""
        future = self._future
        if future is None:
            self._moved.clear()
            future = self._future = asyncio.ensure_future(self._get(consumer, wait, max_records))
        await asyncio.wait([future], timeout=wait + POLL_GRACE_SECONDS)
        if self._future is not future or future.cancelled():
            return {}  # a close took it (a new client's fetch may be in flight): none of it
        if not future.done():
            return {}
        self._future = None
        batches, generation, stamp = future.result()
        if generation != self._generation():  # rebalanced since: from the committed offsets
            return {}
        for tp, (moved, sought) in self._moved.items():
            found = batches.get(tp)
            if moved > stamp and found:
                del batches[tp]
                if sought <= stamp and tp in consumer.assignment():  # only paused since
                    consumer.seek(tp, found[0].offset)
        return batches

    async def _get(
        self, consumer: AIOKafkaConsumer, wait: float, max_records: int
    ) -> tuple[Batches, int, int]:
        """What ``getmany`` handed out, with the generation and the last stamp then (read in the
        same step, before any other task runs)."""
        batches = await consumer.getmany(timeout_ms=int(wait * 1000), max_records=max_records)
        return batches, self._generation(), self._stamp


__all__ = ["POLL_GRACE_SECONDS", "HeldFetch"]
