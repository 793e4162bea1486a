"""What a topic's configuration makes the broker refuse, found before sending.

The broker refuses a record batch above the topic's ``max.message.bytes`` and a record without a
key for a compacted topic. Outside a transaction an acknowledged record cannot be taken back: a
refused record with later records of its key in other batches of the same send would be
overtaken by them for good. So each topic's configuration is read once per producer life (with
its metadata, see ``topic_gate``), and:

* a record without a key for a compacted topic is parked before anything is sent;
* in ``at_least_once`` mode, for a topic whose limit is below the largest batch the producer
  builds (*tight*), a send is cut into several, each awaited before the next goes: a record that
  might be refused alone goes in a send of its own (nothing after it is produced unless it is
  acknowledged), and the others in sends of at most the topic's limit, so no batch of them is
  refused whole. The size is an upper bound of the record as the batch carries it, uncompressed
  (with a margin for the little compression adds to data it cannot shrink): compression makes
  most records smaller, so nothing is parked on it, only sent alone. Refused there, it is parked
  with the broker's reason and the rows acknowledged before it are marked (``publisher``).

Exactly-once needs no cutting (an aborted transaction takes everything back) and is not slowed
by it. Records of topics that are not tight cost nothing per record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence

from outboxkit.errors import PublishError
from outboxkit.kafka.api import (
    NOT_SENT,
    Delivery,
    ProduceRequest,
    RecordError,
    TransactionalProducer,
)
from outboxkit.kafka.errors import ErrorKind

logger = logging.getLogger("outboxkit.relay.shard_worker")

BATCH_OVERHEAD = 61  # a v2 record batch's header, counted in its size
_RECORD_OVERHEAD = 36  # at most: length, attributes, timestamp and offset deltas, key and value
# lengths, header count (varints at their longest)
_HEADER_OVERHEAD = 10  # at most: a header's name and value lengths


def record_bound(request: ProduceRequest) -> int:
    """An upper bound of the record's bytes in an uncompressed v2 batch."""
    _, key, value, headers, _ = request
    size = len(value) + (len(key) if key is not None else 0) + _RECORD_OVERHEAD
    for name, header in headers:
        size += len(name.encode()) + len(header) + _HEADER_OVERHEAD
    return size


def send_budget(limit: int) -> int:
    """Bytes of one batch a topic of ``max.message.bytes`` = ``limit`` takes for sure: a
    margin for compression, which makes incompressible data a little larger."""
    return limit - limit // 512 - 64


def pieces(requests: Sequence[ProduceRequest], budgets: dict[str, int]) -> list[int] | None:
    """The ends of the sends ``requests`` is cut into (None: one send). A tight topic's records
    in one send stay within its budget; a record above it goes alone."""
    ends: list[int] = []
    used: dict[str, int] = {}
    start = 0
    for index, request in enumerate(requests):
        budget = budgets.get(request[0])
        if budget is None:
            continue
        size = record_bound(request)
        if BATCH_OVERHEAD + size > budget:  # it might be refused: nothing goes with it
            if index > start:
                ends.append(index)
            ends.append(index + 1)
            start, used = index + 1, {}
            continue
        total = used.get(request[0], BATCH_OVERHEAD) + size
        if total > budget:  # the batch of its partition might pass the limit: a new send
            ends.append(index)
            start, used, total = index, {}, BATCH_OVERHEAD + size
        used[request[0]] = total
    if not ends:
        return None
    if ends[-1] < len(requests):
        ends.append(len(requests))
    return ends


class BrokerLimits:
    """One shard's knowledge of its topics' configurations (for one producer life)."""

    def __init__(self, shard: int) -> None:
        self.shard = shard
        self._budgets: dict[str, int] = {}  # tight topics (at_least_once only)
        self._keyless: dict[str, RecordError] = {}  # compacted topics: why a keyless record fails
        self._warned: set[str] = set()  # topics whose configuration could not be read
        self.alone: int | None = None  # the last send's record refused in a send of its own

    def forget(self) -> None:
        self._budgets.clear()
        self._keyless.clear()

    async def learn(self, producer: TransactionalProducer, topic: str) -> None:
        """Read the topic's configuration; if it cannot be read, say once what is lost."""
        try:
            limits = await producer.topic_limits(topic)
        except PublishError as exc:
            if topic not in self._warned:
                self._warned.add(topic)
                logger.warning(
                    "shard %s: the configuration of topic %r cannot be read (%s; the relay's"
                    " Kafka principal needs DescribeConfigs on it): %s",
                    self.shard,
                    topic,
                    exc,
                    _LOST_EOS if producer.transactional else _LOST_ALO,
                )
            return
        if limits.compacted:
            self._keyless[topic] = RecordError(
                "INVALID_RECORD",
                f"topic {topic!r} has cleanup.policy={limits.cleanup_policy}: the broker refuses"
                " a record without a key for a compacted topic",
            )
        limit = limits.max_message_bytes
        if not producer.transactional and limit is not None and limit < producer.largest_batch:
            self._budgets[topic] = send_budget(limit)

    def keyless_refused(self, topics: Collection[str]) -> dict[str, RecordError]:
        """Of ``topics``, the compacted ones: why a record without a key for each is refused."""
        keyless = self._keyless
        if not keyless:
            return {}
        return {topic: keyless[topic] for topic in topics if topic in keyless}

    async def send(
        self,
        producer: TransactionalProducer,
        requests: list[ProduceRequest],
        check: Callable[[], None],
    ) -> list[Delivery]:
        """``producer.send``, cut into several for tight topics (see the module doc); after a
        failed one nothing more is produced (``NOT_SENT``). ``check``: the term's, between."""
        self.alone = None
        budgets = self._budgets
        ends = pieces(requests, budgets) if budgets else None
        if ends is None:
            return await producer.send(requests) if requests else []
        deliveries: list[Delivery] = []
        start = 0
        for end in ends:
            if start:
                check()
            got = await producer.send(requests[start:end])
            deliveries.extend(got)
            failed = [d.error for d in got if d.error is not None]
            if failed:
                if end - start == 1 and failed[0].kind is ErrorKind.PERMANENT:
                    self.alone = start
                deliveries.extend([NOT_SENT] * (len(requests) - end))
                break
            start = end
        return deliveries


_LOST_ALO = (
    "a record the broker refuses for this topic's max.message.bytes or cleanup.policy is found"
    " only when it is refused, and later rows of its key sent with it may overtake it (the"
    " at_least_once per-key order holds against such a refusal only with the configuration"
    " readable)"
)
_LOST_EOS = (
    "a record without a key for a compacted topic is found only when the broker refuses it"
    " (its transaction is aborted and retried)"
)
