"""What a topic's configuration makes the broker refuse, found before sending.

The broker refuses a record batch above the topic's ``max.message.bytes`` and a record without a
key for a compacted topic. Outside a transaction an acknowledged record cannot be taken back: a
refused record with later records of its key in other batches of the same send would be
overtaken by them for good. So each topic's configuration is read at its first claim of a producer
life (with its metadata, see ``topic_gate``), and:

* a record without a key for a compacted topic is parked before anything is sent;
* in ``at_least_once`` mode, for a topic whose limit is below the largest record the producer
  sends, a record that might be refused goes in a send of its own, each send awaited before the
  next (nothing after it is produced unless it is acknowledged); for a topic whose limit is
  below the producer's batches of several records (*tight*: its batch size), the others go in
  sends of at most the topic's limit too, so no batch of them is refused whole. The size is an
  upper bound of the record as the batch carries it, uncompressed, with a margin for the little
  compression adds to data it cannot shrink: compression makes most records smaller, so nothing
  is parked on it, only sent alone. Refused there, it is parked with the broker's reason and the
  rows acknowledged before it are marked (``publisher``).

A configuration may change while the relay runs (a limit lowered, a topic made compacted): a
read is used for about ``REFRESH_AFTER`` seconds (spread by up to ``REFRESH_SPREAD``, so the
topics read at one claim do not all fall due at one later claim), then read again at a claim of
its topic; a broker refusal that may come from a changed configuration (a record or batch too
large, a record without a key refused) has it read again at the next claim (within the first
reads' budget), at most every ``RETRY_AFTER`` seconds per topic from the read it asked for. A
read that finds a configuration changed says so. The other reads again of one claim share only
``REREAD_BUDGET`` seconds (their last read still applies, so a stalled admin path, while produce
works, must not hold every claim): a topic not reached stays due for a later claim, and one
whose read again times out is said at INFO and tried again as any failed read.

A configuration that cannot be read changes nothing but that protection (and the parking of keyless
records before sending): a missing DescribeConfigs ACL is said once per topic (again if lost after
a read) and asked again as a read is (``REFRESH_AFTER``); any other failure (a timeout) is said and
the read tried again at a later claim, at most every ``RETRY_AFTER`` s. The reads of one claim
share ``READ_BUDGET`` seconds (on the producer's one admin client of its life), each started with
at least ``MIN_SHARE`` of it left: a topic not read by then counts as a failed read. A read given
up on runs on until the admin's own timeout (confluent-kafka's in a thread the producer needs too):
until it ends no read starts (said once; a topic not read stays due, with no back-off), and its
answer is dropped. A failed read never stops publishing; one of a topic read before (in this
producer life or an earlier one) keeps what that read said for the rest of the producer life: the
next life reads it at its first claim, whatever the failed read's back-off.

Exactly-once needs no cutting (an aborted transaction takes everything back) and is not slowed
by it. Records of topics without a budget cost nothing per record.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Collection, Iterable, Sequence

from outboxkit.errors import OutboxkitError
from outboxkit.futures import retrieved
from outboxkit.kafka.api import (
    NOT_SENT,
    UNAUTHORISED,
    Delivery,
    ProduceRequest,
    RecordError,
    TopicLimits,
    TransactionalProducer,
)
from outboxkit.kafka.errors import ErrorKind

logger = logging.getLogger("outboxkit.relay.shard_worker")
Check = Callable[[], None]  # the term's check, between awaits

BATCH_OVERHEAD = 61  # a v2 record batch's header, counted in its size
_RECORD_OVERHEAD = 36  # at most: length, attributes, deltas, key/value lengths, header count
_HEADER_OVERHEAD = 10  # at most: a header's name and value lengths
RETRY_AFTER = 60.0  # seconds before a configuration whose read failed (not for an ACL) is asked
READ_BUDGET = 10.0  # seconds all configuration reads of one claim may take together
REREAD_BUDGET = 1.0  # seconds the reads again of one claim (limits still in use) may take
MIN_SHARE = 0.25  # a read starts only with this share of its budget left (else doomed to fail)
_BUSY = "an earlier read given up on still waits for its answer"  # it runs (a thread) until then
# Seconds a read is used (then read again at a claim of its topic): as long as both clients keep
# topic metadata (metadata.max.age.ms, topic.metadata.refresh.interval.ms), so a changed limit is
# found as soon as a changed partition count, at one DescribeConfigs per topic and shard each 5 min.
REFRESH_AFTER = 300.0
REFRESH_SPREAD = 0.2  # each read is used REFRESH_AFTER times a factor within 1 ± this
# Refusals a changed configuration may explain (too large; keyless for a compacted topic, older
# brokers: CORRUPT_MESSAGE) in both clients' names (aiokafka's RecordTooLargeError is a consumer's).
_CONFIG_REFUSALS = frozenset({
    "MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_RECORD", "CORRUPT_MESSAGE",
    "MessageSizeTooLargeError", "RecordListTooLargeError", "InvalidRecordError",
    "CorruptRecordException",
})  # fmt: skip


def _spread() -> float:
    return random.uniform(1 - REFRESH_SPREAD, 1 + REFRESH_SPREAD)


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


def pieces(
    requests: Sequence[ProduceRequest], budgets: dict[str, int], cut: Collection[str] | None = None
) -> list[int] | None:
    """The ends of the sends ``requests`` is cut into (None: one send). A record above its
    topic's budget goes alone; the other records of a topic in ``cut`` (None: every topic of
    ``budgets``) in one send stay within its budget."""
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
        if cut is not None and request[0] not in cut:
            continue  # the producer's batches of several stay below the topic's limit
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

    def __init__(
        self,
        shard: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        read_budget: float = READ_BUDGET,
        reread_budget: float = REREAD_BUDGET,
        spread: Callable[[], float] = _spread,
    ) -> None:
        self.shard = shard
        self.read_budget, self.reread_budget = read_budget, reread_budget
        self._budgets: dict[str, int] = {}  # a record above it goes alone (at_least_once only)
        self._cut: set[str] = set()  # tight topics: all their records within their budget
        self._keyless: dict[str, RecordError] = {}  # compacted topics: why a keyless record fails
        self._learned: set[str] = set()  # read in this producer life, or not readable (no ACL)
        self._due: dict[str, float] = {}  # a topic of ``_learned``: read again from then
        self._refresh_at = math.inf  # at most the earliest of ``_due``: until then none is due
        self._stale: set[str] = set()  # due, not read again yet: its last read still applies
        self._marked: dict[str, float] = {}  # a refusal had it read again: not before then
        self._asked: set[str] = set()  # to be read for a refusal: ``_marked`` set at that read
        self._read: dict[str, TopicLimits] = {}  # each topic's last read (to say a change)
        self._retry_at: dict[str, float] = {}  # a failed read: not asked again before then
        self._unauthorised: set[str] = set()  # topics said to need DescribeConfigs (once each)
        self._inflight: asyncio.Future[TopicLimits] | None = None  # the last read given up on
        self._held: asyncio.Future[TopicLimits] | None = None  # the one said to hold reads
        self._clock = clock
        self._spread = spread
        self.alone: int | None = None  # the last send's record refused in a send of its own

    def forget(self) -> None:
        """A new producer life reads again (a failed read keeps its back-off, but not one of a
        topic read before), with what it may use (a read given up on may still run)."""
        now, stale = self._clock(), self._stale
        self._retry_at = {t: at for t, at in self._retry_at.items() if at > now and t not in stale}
        self._marked = {t: at for t, at in self._marked.items() if at + RETRY_AFTER > now}
        for known in (self._budgets, self._cut, self._keyless, self._learned, self._due):
            known.clear()
        self._refresh_at = math.inf
        self._stale.clear()
        self._asked.clear()

    def unlearned(self, topics: Iterable[str]) -> list[str]:
        """Of ``topics``, those to read now: not read in this life or due again, not backing off."""
        now = self._clock()
        if now >= self._refresh_at:
            self._expire(now)
        learned, retry_at = self._learned, self._retry_at
        todo = [topic for topic in topics if topic not in learned]
        if todo and retry_at:
            todo = [topic for topic in todo if retry_at.get(topic, now) <= now]
        return todo

    def _expire(self, now: float) -> None:
        """Topics whose read is due are read again at their next claim (their limits stay); one
        never read (its ACL refused it) is asked as a first read is."""
        due = self._due
        for topic in [topic for topic, at in due.items() if at <= now]:
            del due[topic]
            self._learned.discard(topic)
            if topic in self._read:
                self._stale.add(topic)
        self._refresh_at = min(due.values(), default=math.inf)

    def refused(self, failures: Iterable[tuple[str, RecordError]]) -> None:
        """The broker refused records (topic, error): one too large or without a key may mean its
        topic's configuration changed since it was read, so that is read again at the next claim
        (for this reason at most every ``RETRY_AFTER`` seconds per topic)."""
        for topic, error in failures:
            if error.local or error.name not in _CONFIG_REFUSALS or topic not in self._due:
                continue  # the client's own (or not read in this life): nothing to refresh
            at = max(self._clock(), self._marked.get(topic, -math.inf) + RETRY_AFTER)
            if at < self._due[topic]:
                self._due[topic] = self._marked[topic] = at
                self._refresh_at = min(self._refresh_at, at)
                self._asked.add(topic)

    async def learn_all(
        self, producer: TransactionalProducer, topics: Sequence[str], check: Check
    ) -> None:
        """Read the topics' configurations within one ``read_budget`` (a stalled broker must not
        hold a claim for a read timeout per topic), those a refusal asked for last, then the others
        due within ``reread_budget`` (one not reached stays due); ``check``: the term's, between."""
        stale, asked = self._stale, self._asked
        again = [topic for topic in topics if topic in stale and topic not in asked]
        first = sorted([t for t in topics if t not in stale or t in asked], key=stale.__contains__)
        late = await self._learn_within(producer, first, self.read_budget, check)
        why = _BUSY if self._waiting() else f"not read within {self.read_budget}s"
        for topic in [topic for topic in late if topic not in stale]:  # read again later
            self._failed(producer, topic, TimeoutError(why))
        await self._learn_within(producer, again, self.reread_budget, check)

    def _waiting(self) -> bool:
        return self._inflight is not None and not self._inflight.done()

    async def _learn_within(
        self, producer: TransactionalProducer, topics: list[str], budget: float, check: Check
    ) -> list[str]:
        """Read ``topics`` one after another for at most ``budget`` seconds: those not read
        (not started with less than ``MIN_SHARE`` of it left, or while a read still runs)."""
        deadline = self._clock() + budget
        for index, topic in enumerate(topics):
            remaining = deadline - self._clock()
            if remaining < budget * MIN_SHARE or self._waiting():
                return topics[index:]
            await self.learn(producer, topic, remaining)
            check()
        return []

    async def learn(
        self, producer: TransactionalProducer, topic: str, within: float | None = None
    ) -> None:
        """Read the topic's configuration; if it cannot be read, say why and what is lost."""
        if topic in self._asked:  # a refusal asked for it: the next such read not before then
            self._asked.discard(topic)
            self._marked[topic] = self._clock()
        read = asyncio.ensure_future(producer.topic_limits(topic))
        try:  # shielded: a thread is not stopped by cancelling; it stays the read in flight
            limits = await asyncio.wait_for(asyncio.shield(read), within)
        except Exception as exc:  # whatever a failed read raises, it never ends the term
            if isinstance(exc, TimeoutError) and not str(exc):  # wait_for's says nothing
                exc = TimeoutError("no answer in time")
            self._failed(producer, topic, exc)
            return
        finally:
            read.add_done_callback(retrieved)  # also one that failed as the wait timed out
            if not read.done():
                self._inflight = read
        self._retry_at.pop(topic, None)
        self._unauthorised.discard(topic)  # readable now: a missing ACL later is said again
        self._learned_until_due(topic)
        before, self._read[topic] = self._read.get(topic), limits
        if before is not None and before != limits:
            logger.info(
                "shard %s: the configuration of topic %r changed: max.message.bytes %s -> %s,"
                " cleanup.policy %s -> %s",
                self.shard,
                topic,
                before.max_message_bytes,
                limits.max_message_bytes,
                before.cleanup_policy,
                limits.cleanup_policy,
            )
        self._apply(producer, topic, limits)

    def _learned_until_due(self, topic: str) -> None:
        self._learned.add(topic)
        self._stale.discard(topic)
        due = self._due[topic] = self._clock() + REFRESH_AFTER * self._spread()
        self._refresh_at = min(self._refresh_at, due)

    def _apply(self, producer: TransactionalProducer, topic: str, limits: TopicLimits) -> None:
        """What ``limits`` says of the topic replaces what was said before."""
        self._budgets.pop(topic, None)
        self._cut.discard(topic)
        self._keyless.pop(topic, None)
        if limits.compacted:
            self._keyless[topic] = RecordError(
                "INVALID_RECORD",
                f"topic {topic!r} has cleanup.policy={limits.cleanup_policy}: the broker refuses"
                " a record without a key for a compacted topic",
            )
        limit = limits.max_message_bytes
        if producer.transactional or limit is None:
            return
        budget = send_budget(limit)  # not the limit: compression may enlarge a full batch
        if producer.largest_batch > budget:
            self._cut.add(topic)
        if producer.largest_batch > budget or producer.largest_record > budget:
            self._budgets[topic] = budget

    def _failed(self, producer: TransactionalProducer, topic: str, exc: Exception) -> None:
        if topic not in self._stale and topic in self._read:  # read in an earlier life
            self._apply(producer, topic, self._read[topic])  # better than nothing: used again
            self._stale.add(topic)
        if topic in self._stale:  # read before: that read still applies
            lost = "the configuration read before stays in use"
        else:
            lost = _LOST_EOS if producer.transactional else _LOST_ALO
        cause = str(exc) if isinstance(exc, OutboxkitError) else f"{type(exc).__name__}: {exc}"
        said = (self.shard, topic, cause)
        if isinstance(exc, OutboxkitError) and exc.context.get("error") in UNAUTHORISED:
            self._learned_until_due(topic)  # asked again as a read would be: granted since?
            if topic not in self._unauthorised:
                self._unauthorised.add(topic)
                logger.warning(
                    "shard %s: the configuration of topic %r may not be read (%s): the relay's"
                    " Kafka principal needs DescribeConfigs on the topic; until then %s",
                    *said,
                    lost,
                )
            return
        if str(exc) == _BUSY:  # no back-off: a claim skips it at no cost until that read ends
            if self._held is self._inflight:
                return  # said once per read given up on
            self._held, when = self._inflight, "once that read ends (as any other it holds)"
        else:
            self._retry_at[topic] = self._clock() + RETRY_AFTER
            when = f"again at a claim at least {RETRY_AFTER:.0f}s from now"
        late = topic in self._stale and isinstance(exc, TimeoutError)  # its limits still apply
        logger.log(
            logging.INFO if late else logging.WARNING,
            "shard %s: the configuration of topic %r could not be read (%s); it is read %s,"
            " and until it is read %s",
            *said,
            when,
            lost,
        )

    def keyless_refused(self, topics: Collection[str]) -> dict[str, RecordError]:
        """Of ``topics``, the compacted ones: why a record without a key for each is refused."""
        keyless = self._keyless  # none: nothing to look up
        return {topic: keyless[topic] for topic in topics if topic in keyless} if keyless else {}

    async def send(
        self, producer: TransactionalProducer, requests: list[ProduceRequest], check: Check
    ) -> list[Delivery]:
        """``producer.send``, cut into several for tight topics (see the module doc); after a
        failed one nothing more is produced (``NOT_SENT``). ``check``: the term's, between."""
        self.alone = None
        budgets = self._budgets
        ends = pieces(requests, budgets, self._cut) if budgets else None
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
