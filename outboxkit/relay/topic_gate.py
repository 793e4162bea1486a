"""Which rows of a claim can go to Kafka: rows of a topic that cannot take records, and rows
the reader could not turn into a record (``ShardStore.defects``), are parked.

Each topic is asked about once per producer life (its metadata); a topic that does not exist or
that the relay may not write to is a permanent problem, so its rows are parked with the reason
instead of being retried forever. So are rows addressed to the relay's own checkpoint topic: a
record there would be read back as a checkpoint at the next takeover (rows marked published that
never were, or an unreadable checkpoint that stops the shard). With ``parked_key_policy = wait``
a later row of a parked key stays back (the next claim leaves it out), so per-key order holds.
A topic's configuration is read after its metadata (``broker_limits``; a failed read is tried
again at a later claim, and a read is repeated once it is old or a refusal may mean the topic's
configuration changed): a row without a key for a compacted topic is parked here too, before
anything is sent. A stop cuts these questions to Kafka short (a broker that is away answers
only at the end of the question's timeout, up to 10 s): the claim is then sent as nothing, its
rows left pending for the next owner, so the lease goes at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import psycopg

from outboxkit.events import INTERNAL_TOPICS
from outboxkit.kafka.api import RecordError, TransactionalProducer
from outboxkit.kafka.errors import with_topic_write_hint
from outboxkit.relay.broker_limits import BrokerLimits
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.reader import OutboxRecord, ShardStore
from outboxkit.relay.waiting import finished_unless

logger = logging.getLogger("outboxkit.relay.shard_worker")

Conn = psycopg.AsyncConnection[Any]

CHECKPOINT_TOPIC_REFUSED = "the relay's checkpoint topic takes only the relay's own records"
INTERNAL_TOPIC_REFUSED = "a Kafka-internal topic takes no application records"

T = TypeVar("T")


class _Stopping(Exception):
    """The relay stops while the gate waits for Kafka's answer (never leaves this module)."""


class TopicGate:
    def __init__(
        self,
        shard: int,
        store: ShardStore,
        metrics: RelayMetrics,
        *,
        wait_behind_parked: bool,
        checkpoint_topic: str,
        stop: asyncio.Event | None = None,
    ) -> None:
        self.shard = shard
        self.limits = BrokerLimits(shard)  # the topics' configurations, read with their metadata
        self._checkpoint_topic = checkpoint_topic
        self._store = store
        self._metrics = metrics
        self._wait_behind_parked = wait_behind_parked
        self._label = str(shard)
        self._known_topics: set[str] = set()
        self._stop = stop if stop is not None else asyncio.Event()

    def forget(self) -> None:
        """Topic knowledge belongs to one producer life (its metadata)."""
        self._known_topics.clear()
        self.limits.forget()

    async def sendable(
        self,
        term: LeaseTerm,
        conn: Conn,
        producer: TransactionalProducer,
        claim: list[OutboxRecord],
    ) -> list[OutboxRecord]:
        """The claim without rows that cannot become records (those are parked): rows of
        topics that cannot take records, rows the reader found defective, and rows without a
        key for a compacted topic. Nothing when the relay stops while Kafka is asked."""
        topics = {r.topic for r in claim}
        try:  # no question at all once every topic of the claim is known and read
            known = topics <= self._known_topics
            problems = {} if known else await self._problems(term, producer, topics)
            # Until it is read (a failed read is tried again later), rows of the topic go
            # unchecked; one due to be read again (``REFRESH_AFTER``) keeps its last read.
            unlearned = self.limits.unlearned(topics - problems.keys())
            if unlearned:
                await self._asked(self.limits.learn_all(producer, unlearned, term.check))
        except _Stopping:
            return []  # nothing sent, nothing parked: the rows stay pending
        defects = self._store.defects
        keyless = self.limits.keyless_refused(topics)
        if (
            problems
            or (defects and any(r.id in defects for r in claim))
            or (keyless and any(r.key is None and r.topic in keyless for r in claim))
        ):
            return await self._park_unsendable(term, conn, claim, problems, keyless)
        return claim

    async def _asked(self, question: Awaitable[T]) -> T:
        task = asyncio.ensure_future(question)
        if not await finished_unless(task, self._stop):
            raise _Stopping
        return task.result()

    async def _problems(
        self, term: LeaseTerm, producer: TransactionalProducer, topics: set[str]
    ) -> dict[str, RecordError]:
        """Why each topic not known yet cannot take records (each is checked once per claim,
        and known-good topics not at all, not per row)."""
        problems: dict[str, RecordError] = {}
        unknown = topics - self._known_topics
        new = unknown - {self._checkpoint_topic} - INTERNAL_TOPICS
        if new:  # what the producer asks beyond metadata: in one request, under one wait
            logger.debug("shard %s: asking Kafka about topic(s) %s", self.shard, sorted(new))
            await self._asked(producer.ask_ahead(new))
            term.check()
        for topic in unknown:
            if topic == self._checkpoint_topic:
                problems[topic] = RecordError("CHECKPOINT_TOPIC", CHECKPOINT_TOPIC_REFUSED)
                continue
            if topic in INTERNAL_TOPICS:  # written by hand or by an older writer
                problems[topic] = RecordError("INTERNAL_TOPIC", INTERNAL_TOPIC_REFUSED)
                continue
            problem = await self._asked(producer.topic_problem(topic))
            term.check()
            if problem is None:
                self._known_topics.add(topic)
            else:
                problems[topic] = problem
        return problems

    async def park(self, term: LeaseTerm, conn: Conn, record: OutboxRecord, why: str) -> None:
        why = with_topic_write_hint(why)  # a record refused at send (at least once) says it too
        await self._store.park(conn, term, record.id, why)
        self._metrics.parked.labels(self._label).inc()
        logger.warning(
            "shard %s: parked row %s (topic %s): %s", self.shard, record.id, record.topic, why
        )

    async def _park_unsendable(
        self,
        term: LeaseTerm,
        conn: Conn,
        batch: list[OutboxRecord],
        problems: dict[str, RecordError],
        keyless: dict[str, RecordError],
    ) -> list[OutboxRecord]:
        """Park the defective rows, those whose topic cannot take records and those without a
        key for a compacted topic (``keyless``); the rest of the batch, in order."""
        parked_keys: set[str] = set()
        to_send: list[OutboxRecord] = []
        defects = self._store.defects
        for record in batch:
            if self._wait_behind_parked and record.key is not None and record.key in parked_keys:
                continue  # waits behind its parked predecessor; the next claim excludes it
            problem = defects.get(record.id) or problems.get(record.topic)
            if problem is None and record.key is None:
                problem = keyless.get(record.topic)
            if problem is not None:
                await self.park(term, conn, record, str(problem))
                defects.pop(record.id, None)
                term.check()
                if record.key is not None:
                    parked_keys.add(record.key)
                continue
            to_send.append(record)
        return to_send
