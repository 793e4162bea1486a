"""Where each partition goes on from after a stop cut a confluent-kafka poll short.

librdkafka moves a partition's position past the messages ``consume()`` hands out. A stop
(``KeyboardInterrupt``, ``SystemExit``, anything) raised in that call or before the poll returned
its records (a Ctrl-C during a blocking ``consume()`` is raised as the call returns) dropped
them: the next poll fetched the records behind them, and the offsets committed for those went
past records that never ran. So a poll notes, per partition, the offset after the last record it
handed over (a seek of the inbox's moves it too), and one that did not end leaves the consumer
*cut*: the next poll first seeks every assigned partition back there. A partition nothing was
handed over from since its assignment goes back to its committed offset, which is where it
started (librdkafka's seek refuses ``OFFSET_STORED``), or with none to where
``auto.offset.reset`` starts it (``OFFSET_INVALID``; ``latest`` is the end now, not then).

A seek back that fails makes that poll fetch nothing (after waiting its timeout, not at once);
a client that refused one in :data:`REWIND_ATTEMPTS` seek-backs in a row is replaced, as
librdkafka's position must not move on past what it never handed over (the new client starts
from the committed offsets, which never pass a record that did not run).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from outboxkit.errors import PublishError
from outboxkit.kafka.api import ConsumedRecord
from outboxkit.kafka.api import TopicPartition as TP

logger = logging.getLogger("outboxkit.kafka.consumer")

#: Seconds the committed offsets of a cut poll's partitions may take to read.
COMMITTED_READ_SECONDS = 10.0
#: Seek-backs in a row a seek was refused in, after which the client is replaced.
REWIND_ATTEMPTS = 5

Committed = Callable[[list[TP], float], dict[TP, int]]


class FetchPositions:
    """Per partition, the offset after the last record handed over; pure logic.

    A poll's hand-over is one attribute store (:meth:`ended`) and taken in at the next poll
    (:meth:`begin`): a stop anywhere in between leaves it out, never half in.
    """

    __slots__ = ("_ended", "next", "refused")

    def __init__(self) -> None:
        self.next: dict[TP, int] = {}
        self.refused = 0  # seek-backs in a row a seek was refused in
        # What the last poll handed over, per partition; None while a poll runs, or was cut.
        self._ended: dict[TP, int] | None = {}

    @property
    def cut(self) -> bool:
        return self._ended is None

    @property
    def stuck(self) -> bool:
        """The client keeps refusing the seek back: replace it."""
        return self.refused >= REWIND_ATTEMPTS

    def begin(self) -> bool:
        """A poll starts; ``False``: the last one was cut (seek back before fetching)."""
        ended = self._ended
        if ended is None:
            return False
        self._take(ended)
        self._ended = None
        return True

    def ended(self, records: list[ConsumedRecord]) -> None:
        """The poll hands ``records`` over (a dict write per record, one store for them all)."""
        last = {}
        for record in records:
            last[record.topic, record.partition] = record.offset + 1
        self._ended = last

    def _take(self, ended: dict[TP, int]) -> None:
        if ended:  # idempotent: a stop between this and the store after takes it in again
            self.next.update(ended)

    def sought(self, partition: TP, offset: int) -> None:
        """The inbox sought ``partition`` (a retry's seek back, its resume)."""
        if self._ended:
            self._take(self._ended)
            self._ended = {}
        self.next[partition] = offset

    def assigned(self, partitions: Iterable[TP]) -> None:
        """Assigned (again): it starts from its committed offset, not where it was."""
        for partition in partitions:
            self.next.pop(partition, None)
            if self._ended:
                self._ended.pop(partition, None)

    def targets(self, assigned: Iterable[TP]) -> tuple[dict[TP, int], list[TP]]:
        """Where to seek each assigned partition back to, and those nothing was handed over
        from (their committed offsets are read)."""
        found, unknown = {}, []
        for partition in assigned:
            offset = self.next.get(partition)
            if offset is None:
                unknown.append(partition)
            else:
                found[partition] = offset
        return found, unknown


def ready(
    consumer: Consumer, positions: FetchPositions, committed: Committed, wait: float = 0.0
) -> bool:
    """A poll starts: if the last one was cut short, seek back first; ``False`` if that failed
    (the poll fetches nothing, after ``wait`` seconds, its timeout: polled in a loop it must not
    spin; and the next one tries again)."""
    if positions.begin() or rewind(consumer, positions, committed):
        return True
    if wait > 0:
        time.sleep(wait)
    return False


def rewind(consumer: Consumer, positions: FetchPositions, committed: Committed) -> bool:
    """Seek every assigned partition back to the first record not handed over; ``False`` if
    that failed (the poll fetches nothing, and the next one tries again)."""
    targets, unknown = positions.targets((p.topic, p.partition) for p in consumer.assignment())
    if unknown:
        try:
            read = committed(unknown, COMMITTED_READ_SECONDS)
        except PublishError as exc:
            logger.warning("a poll was cut short; seeking back waits for %s", exc)
            return False
        positions.next.update(read)
        targets.update({tp: read.get(tp, OFFSET_INVALID) for tp in unknown})
    for (topic, partition), offset in targets.items():
        try:
            consumer.seek(TopicPartition(topic, partition, offset))
        except KafkaException as exc:  # not fetching it (yet): consume() is not called till it is
            positions.refused += 1
            logger.warning(
                "a poll was cut short; seeking %s/%d back failed (%d of %d times before the"
                " client is replaced): %s",
                topic,
                partition,
                positions.refused,
                REWIND_ATTEMPTS,
                exc,
            )
            return False
    positions.refused = 0
    logger.info("a poll was cut short: %d partition(s) sought back", len(targets))
    return True


__all__ = ["COMMITTED_READ_SECONDS", "REWIND_ATTEMPTS", "FetchPositions", "ready", "rewind"]
