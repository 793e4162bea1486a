"""A topic's configuration changed while the relay runs (``broker_limits``): read again at a
claim once the last read is ``REFRESH_AFTER`` old, or at once after the broker refused one of
its records for its size (at most every ``RETRY_AFTER`` from that read); a failed read again
keeps what was read before for the rest of the producer life. Reads again fall due at spread
times and share a small part of a claim. Before, it was read once per producer life: a lowered
limit was found only after a transient error or a restart, and sends were not cut meanwhile."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Any

import pytest

from outboxkit.errors import PublishError
from outboxkit.kafka.api import RecordError, TopicLimits
from outboxkit.relay.broker_limits import (
    READ_BUDGET,
    REFRESH_AFTER,
    REFRESH_SPREAD,
    REREAD_BUDGET,
    RETRY_AFTER,
    BrokerLimits,
)
from outboxkit.relay.publisher import Outcome
from outboxkit.relay.topic_gate import TopicGate
from tests.unit.test_relay_broker_limits import (
    _CONN,
    TOO_LARGE,
    _FlakyProducer,
    _request,
    _row,
    _row_of,
    _SlowProducer,
    _Term,
)
from tests.unit.test_relay_broker_limits import _gate as _spread_gate
from tests.unit.test_relay_broker_limits_failures import _publisher, _Store

pytestmark = pytest.mark.unit

DEFAULT = TopicLimits(1_048_588, "delete")  # the broker's default: nothing is cut
LOWERED = TopicLimits(10_000, "delete")
TERM: Any = _Term()
SENDS = [_request("t", 100), _request("t", 20_000), _request("t", 100)]
LOGGER = "outboxkit.relay.shard_worker"


def _gate(clock: list[float], *spreads: float) -> TopicGate:
    """A gate on ``clock`` whose reads are used for REFRESH_AFTER times ``spreads`` in turn
    (exactly REFRESH_AFTER without)."""
    gate = _spread_gate(clock)
    factors = iter(spreads)
    gate.limits._spread = lambda: next(factors, 1.0)
    return gate


def _logged(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


async def test_a_limit_lowered_while_running_cuts_sends_after_the_interval() -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], DEFAULT)
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    producer._limits["t"] = LOWERED  # an operator lowers max.message.bytes
    clock[0] += REFRESH_AFTER / 2
    await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == 1  # within the interval: a claim reads nothing
    await gate.limits.send(producer, SENDS, lambda: None)
    assert producer.sends == [[100, 20_000, 100]]
    clock[0] += REFRESH_AFTER / 2
    await gate.sendable(TERM, _CONN, producer, [_row(3)])
    assert producer.reads == 2
    producer.sends.clear()
    await gate.limits.send(producer, SENDS, lambda: None)
    assert producer.sends == [[100], [20_000], [100]]  # as for a topic low from the start
    await gate.sendable(TERM, _CONN, producer, [_row(4)])
    assert producer.reads == 2  # the next read is REFRESH_AFTER after this one


async def test_a_configuration_read_again_replaces_what_was_read_before() -> None:
    """A topic made compacted, then back to delete with a raised limit: each read decides alone."""
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], DEFAULT)
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    assert gate.limits.keyless_refused({"t"}) == {}
    producer._limits["t"] = TopicLimits(10_000, "compact")
    clock[0] += REFRESH_AFTER
    await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert list(gate.limits.keyless_refused({"t"})) == ["t"]  # keyless rows parked from now
    producer._limits["t"] = DEFAULT
    clock[0] += REFRESH_AFTER
    await gate.sendable(TERM, _CONN, producer, [_row(3)])
    assert gate.limits.keyless_refused({"t"}) == {}
    await gate.limits.send(producer, SENDS, lambda: None)
    assert producer.sends == [[100, 20_000, 100]]  # no longer cut


async def test_a_failed_read_again_keeps_the_limits_read_before_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], LOWERED)
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    producer.failures.append(PublishError("configuration of topic 't': broker gone"))
    clock[0] += REFRESH_AFTER
    with caplog.at_level(logging.WARNING, LOGGER):
        await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == 2
    [record] = caplog.records
    message = record.getMessage()
    assert "configuration of topic 't' could not be read (configuration of topic 't'" in message
    assert "the configuration read before stays in use" in message
    await gate.limits.send(producer, SENDS, lambda: None)
    assert producer.sends == [[100], [20_000], [100]]  # still protected
    await gate.sendable(TERM, _CONN, producer, [_row(3)])
    assert producer.reads == 2  # the failed read's back-off holds
    clock[0] += RETRY_AFTER
    await gate.sendable(TERM, _CONN, producer, [_row(4)])
    assert producer.reads == 3


async def test_reads_again_get_a_small_share_of_a_claim_and_topics_not_reached_stay_due(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A slow admin path while produce works held every claim for READ_BUDGET once the reads
    fell due, and each topic not reached counted as failed, with a warning."""
    clock = [0.0]
    gate = _gate(clock)
    producer = _SlowProducer(clock, takes=0.0)
    claim = [_row_of(1, "a"), _row_of(2, "b"), _row_of(3, "c")]
    await gate.sendable(TERM, _CONN, producer, claim)
    assert sorted(producer.read) == ["a", "b", "c"]
    producer.takes = REREAD_BUDGET * 1.5  # each read again takes longer than its share
    clock[0] += REFRESH_AFTER
    with caplog.at_level(logging.INFO, LOGGER):
        await gate.sendable(TERM, _CONN, producer, claim)
        assert len(producer.read) == 4  # one read again, then the claim goes on
        await gate.sendable(TERM, _CONN, producer, claim)  # the next claim: the next topic
        assert len(producer.read) == 5
    assert len(set(producer.read[3:])) == 2
    assert caplog.records == []  # not reached is not failed: nothing to say
    [left] = {"a", "b", "c"} - set(producer.read[3:])
    await gate.limits.send(producer, [_request(left, 100), _request(left, 20_000)], lambda: None)
    assert producer.sends == [[100], [20_000]]  # its limits still apply meanwhile
    await gate.sendable(TERM, _CONN, producer, claim)
    assert producer.read[5:] == [left]
    await gate.sendable(TERM, _CONN, producer, claim)
    assert len(producer.read) == 6  # all read again: none due


async def test_a_read_again_that_times_out_is_said_at_info_and_keeps_its_limits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _SlowProducer(clock, takes=0.0)
    await gate.sendable(TERM, _CONN, producer, [_row_of(1, "a")])
    producer.stalled = frozenset({"a"})
    gate.limits.read_budget = gate.limits.reread_budget = 0.01  # real seconds (the stall)
    clock[0] += REFRESH_AFTER
    with caplog.at_level(logging.INFO, LOGGER):
        await gate.sendable(TERM, _CONN, producer, [_row_of(2, "a")])
    assert _logged(caplog, logging.WARNING) == []
    [message] = _logged(caplog, logging.INFO)
    assert "topic 'a' could not be read (TimeoutError: no answer in time)" in message
    assert "the configuration read before stays in use" in message
    await gate.limits.send(producer, [_request("a", 100), _request("a", 20_000)], lambda: None)
    assert producer.sends == [[100], [20_000]]
    assert gate.limits.unlearned({"a"}) == []  # a failed read: its back-off holds
    clock[0] += RETRY_AFTER
    assert gate.limits.unlearned({"a"}) == ["a"]


async def test_first_reads_keep_the_whole_budget_before_reads_again() -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _SlowProducer(clock, takes=0.0)
    await gate.sendable(TERM, _CONN, producer, [_row_of(1, "a")])
    producer.takes = READ_BUDGET * 0.4
    clock[0] += REFRESH_AFTER
    await gate.sendable(TERM, _CONN, producer, [_row_of(2, "a"), _row_of(3, "b")])
    assert producer.read == ["a", "b", "a"]  # the new topic first, then the one due
    assert gate.limits.unlearned({"a", "b"}) == []


async def test_reads_of_one_claim_fall_due_at_spread_times() -> None:
    """Every topic read at one claim fell due at one later claim: N reads in a row."""
    clock = [0.0]
    gate = _gate(clock, 1 - REFRESH_SPREAD, 1 + REFRESH_SPREAD)
    producer = _SlowProducer(clock, takes=0.0)
    claim = [_row_of(1, "a"), _row_of(2, "b")]
    await gate.sendable(TERM, _CONN, producer, claim)
    [early, late] = producer.read
    clock[0] += REFRESH_AFTER * (1 - REFRESH_SPREAD)
    await gate.sendable(TERM, _CONN, producer, claim)
    assert producer.read[2:] == [early]
    clock[0] = REFRESH_AFTER * (1 + REFRESH_SPREAD)
    await gate.sendable(TERM, _CONN, producer, claim)
    assert producer.read[3:] == [late]


def test_the_default_spread_is_random_within_its_bounds() -> None:
    limits = BrokerLimits(0)
    factors = {limits._spread() for _ in range(50)}
    assert len(factors) > 1
    assert all(1 - REFRESH_SPREAD <= f <= 1 + REFRESH_SPREAD for f in factors)


async def test_a_refusal_for_size_has_the_topic_read_again_at_the_next_claim() -> None:
    """Through the publisher's failure path: the claim after a record refused as too large
    reads the topic's (lowered) limit and cuts; a topic that keeps refusing is read again at
    most every RETRY_AFTER."""
    clock = [1000.0]
    publisher = _publisher(_Store())
    gate = publisher._gate
    gate.limits._clock = lambda: clock[0]
    producer = _FlakyProducer([], DEFAULT)

    async def refused() -> Outcome:
        return await publisher._handle_failures(
            TERM, _CONN, producer, [1, 2, 3], [(_row(2), TOO_LARGE)], 1
        )

    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    producer._limits["t"] = LOWERED
    assert await refused() is Outcome.RETRY_NOW
    await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == 2  # at once, not after REFRESH_AFTER
    await gate.limits.send(producer, SENDS, lambda: None)
    assert producer.sends == [[100], [20_000], [100]]
    clock[0] += 1
    await refused()  # refused again (a record too large even for the new limit)
    await gate.sendable(TERM, _CONN, producer, [_row(3)])
    clock[0] += RETRY_AFTER - 2
    await gate.sendable(TERM, _CONN, producer, [_row(4)])
    assert producer.reads == 2  # not read at every claim
    clock[0] += 1
    await gate.sendable(TERM, _CONN, producer, [_row(5)])
    assert producer.reads == 3  # RETRY_AFTER after the last read a refusal asked for


async def test_only_refusals_a_changed_configuration_explains_have_it_read_again() -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], DEFAULT)
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    gate.limits.refused([("t", RecordError("UNKNOWN_TOPIC_OR_PART", "gone"))])
    gate.limits.refused([("u", TOO_LARGE)])  # a topic never read: nothing to refresh
    await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == 1
    gate.limits.refused([("t", RecordError("INVALID_RECORD", "no key for a compacted topic"))])
    await gate.sendable(TERM, _CONN, producer, [_row(3)])
    assert producer.reads == 2


async def test_a_new_producer_life_reads_at_once_and_the_interval_starts_again() -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], DEFAULT)
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    clock[0] += REFRESH_AFTER - 1
    gate.forget()
    await gate.sendable(TERM, _CONN, producer, [_row(2)])
    clock[0] += 1
    await gate.sendable(TERM, _CONN, producer, [_row(3)])
    assert producer.reads == 2
    clock[0] += REFRESH_AFTER
    await gate.sendable(TERM, _CONN, producer, [_row(4)])
    assert producer.reads == 3


async def test_a_new_producer_life_after_a_failed_read_again_reads_at_once() -> None:
    """The failed read's back-off outlived the limits it kept: the next life sent that topic's
    records uncut, and parked no keyless row of a compacted topic, for up to RETRY_AFTER."""
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], TopicLimits(10_000, "compact"))
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    producer.failures.append(PublishError("configuration of topic 't': no answer"))
    clock[0] += REFRESH_AFTER
    await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == 2
    assert list(gate.limits.keyless_refused({"t"})) == ["t"]  # the read before stays in use
    gate.forget()  # a send failed: a new producer life
    await gate.sendable(TERM, _CONN, producer, [_row(3)])
    assert producer.reads == 3
    assert list(gate.limits.keyless_refused({"t"})) == ["t"]
    await gate.limits.send(producer, SENDS, lambda: None)
    assert producer.sends == [[100], [20_000], [100]]


async def test_a_first_read_failed_keeps_its_back_off_in_a_new_life() -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([PublishError("configuration of topic 't': no answer")], LOWERED)
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    gate.forget()
    await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == 1  # nothing was read before: the back-off holds, as it did


async def test_the_minute_between_reads_for_refusals_counts_from_the_read() -> None:
    """It counted from when the read was asked for: a claim long after that read the topic,
    and the next refusal had it read again a few seconds later."""
    clock = [1000.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], DEFAULT)
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    gate.limits.refused([("t", TOO_LARGE)])
    clock[0] += RETRY_AFTER - 10  # the next claim comes late
    await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == 2
    gate.limits.refused([("t", TOO_LARGE)])
    clock[0] += 10
    await gate.sendable(TERM, _CONN, producer, [_row(3)])
    assert producer.reads == 2  # 10s after the read: not yet
    clock[0] += RETRY_AFTER - 10
    await gate.sendable(TERM, _CONN, producer, [_row(4)])
    assert producer.reads == 3


async def test_a_read_that_finds_the_configuration_changed_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], DEFAULT)
    with caplog.at_level(logging.INFO, LOGGER):
        await gate.sendable(TERM, _CONN, producer, [_row(1)])
        clock[0] += REFRESH_AFTER
        await gate.sendable(TERM, _CONN, producer, [_row(2)])
        assert caplog.records == []  # the first read, and one that finds nothing new
        producer._limits["t"] = TopicLimits(10_000, "compact")
        clock[0] += REFRESH_AFTER
        await gate.sendable(TERM, _CONN, producer, [_row(3)])
    [message] = _logged(caplog, logging.INFO)
    assert "topic 't' changed: max.message.bytes 1048588 -> 10000" in message
    assert "cleanup.policy delete -> compact" in message


@pytest.mark.parametrize(
    ("name", "read_again"),
    [
        ("CORRUPT_MESSAGE", True),  # older brokers' answer to a keyless record, compacted topic
        ("CorruptRecordException", True),
        ("RecordTooLargeError", False),  # aiokafka's consumer's, never a producer's refusal
    ],
)
async def test_which_refusals_have_the_configuration_read_again(
    name: str, read_again: bool
) -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], DEFAULT)
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    gate.limits.refused([("t", RecordError(name, "refused"))])
    await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == (2 if read_again else 1)


class _Stalling(_SlowProducer):
    """Reads of ``stuck`` topics wait for ``release``, then fail as the admin's own timeout."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__(clock, takes=0.0)
        self.release = asyncio.Event()
        self.stuck: frozenset[str] = frozenset()
        self.free = 0  # so many reads answer first, whatever their topic

    async def topic_limits(self, topic: str) -> TopicLimits:
        if topic not in self.stuck or self.free:
            self.free = max(self.free - 1, 0)
            return await super().topic_limits(topic)
        self.read.append(topic)
        await self.release.wait()
        raise PublishError(f"configuration of topic {topic!r}: timed out")


async def test_a_read_given_up_on_stays_the_only_read_until_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With confluent-kafka a read runs in a thread of the loop's default executor (the
    producer's too) until the admin's timeout: each claim during a stall gave up on one more."""
    clock = [0.0]
    gate = _gate(clock)
    producer = _Stalling(clock)
    await gate.sendable(TERM, _CONN, producer, [_row_of(1, "a"), _row_of(2, "b")])
    gate.limits.read_budget = gate.limits.reread_budget = 0.01  # real seconds (the stall)
    producer.stuck = frozenset({"a", "b", "c", "d"})
    clock[0] += REFRESH_AFTER
    claim = [_row_of(3, "a"), _row_of(4, "b"), _row_of(5, "c")]
    with caplog.at_level(logging.INFO, LOGGER):
        await gate.sendable(TERM, _CONN, producer, claim)
        assert producer.read[2:] == ["c"]  # the first read, given up on: no read again after
        await gate.sendable(TERM, _CONN, producer, [*claim, _row_of(6, "d")])
    assert producer.read[2:] == ["c"]
    [given_up, busy] = _logged(caplog, logging.WARNING)
    assert "topic 'c' could not be read (TimeoutError: no answer in time)" in given_up
    assert "topic 'd' could not be read (TimeoutError: an earlier read given up on" in busy
    assert sorted(gate.limits.unlearned({"a", "b"})) == ["a", "b"]  # not reached: still due
    producer.stuck = frozenset()
    producer.release.set()
    inflight = gate.limits._inflight
    assert inflight is not None
    await asyncio.wait([inflight])
    await gate.sendable(TERM, _CONN, producer, claim)
    assert sorted(producer.read[3:]) == ["a", "b"]  # its late answer is not used


async def test_a_read_given_up_on_that_fails_later_is_not_reported_as_never_retrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [0.0]
    gate = _gate(clock)
    gate.limits.read_budget = 0.01
    producer = _Stalling(clock)
    producer.stuck = frozenset({"a"})
    await gate.sendable(TERM, _CONN, producer, [_row_of(1, "a")])
    inflight = gate.limits._inflight
    assert inflight is not None
    producer.release.set()
    await asyncio.wait([inflight])
    del inflight, gate
    with caplog.at_level(logging.ERROR, "asyncio"):
        gc.collect()
    assert [r for r in caplog.records if r.name == "asyncio"] == []


async def test_a_new_producer_life_starts_no_read_while_one_given_up_on_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [0.0]
    gate = _gate(clock)
    gate.limits.read_budget = 0.01
    producer = _Stalling(clock)
    producer.stuck = frozenset({"a"})
    await gate.sendable(TERM, _CONN, producer, [_row_of(1, "a")])
    gate.forget()  # the thread still runs
    clock[0] += RETRY_AFTER
    caplog.clear()
    with caplog.at_level(logging.WARNING, LOGGER):
        await gate.sendable(TERM, _CONN, producer, [_row_of(2, "a")])
    assert producer.read == ["a"]
    [message] = _logged(caplog, logging.WARNING)
    assert "an earlier read given up on still waits for its answer" in message
    producer.release.set()
    assert gate.limits._inflight is not None  # forget() kept it
    await asyncio.wait([gate.limits._inflight])


async def test_first_reads_held_by_a_read_given_up_on_are_read_once_it_ends_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """They counted as failed: a WARNING per topic and claim, then RETRY_AFTER unprotected,
    though the read holding them ends within the admin's timeout (10 s at most)."""
    clock = [0.0]
    gate = _gate(clock)
    gate.limits.read_budget = 0.01  # real seconds (the stall)
    producer = _Stalling(clock)
    producer.stuck = frozenset({"a"})
    await gate.sendable(TERM, _CONN, producer, [_row_of(1, "a")])  # given up on
    claim = [_row_of(2, "b"), _row_of(3, "c")]
    caplog.clear()
    with caplog.at_level(logging.INFO, LOGGER):
        await gate.sendable(TERM, _CONN, producer, claim)
        await gate.sendable(TERM, _CONN, producer, claim)
    assert producer.read == ["a"]
    [message] = [r.getMessage() for r in caplog.records]
    assert "could not be read (TimeoutError: an earlier read given up on" in message
    assert "it is read once that read ends (as any other it holds)" in message
    producer.release.set()
    inflight = gate.limits._inflight
    assert inflight is not None
    await asyncio.wait([inflight])
    await gate.sendable(TERM, _CONN, producer, claim)  # no time passed: no back-off
    assert sorted(producer.read[1:]) == ["b", "c"]


@pytest.mark.parametrize("due", ["no", "yes", "expired"])
async def test_a_failed_first_read_of_a_new_life_uses_the_read_of_the_life_before(
    caplog: pytest.LogCaptureFixture, due: str
) -> None:
    """The topic went unprotected for RETRY_AFTER though its last read was at hand. A topic
    due (or found due) at forget() was read, in the new life, as a read again."""
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], TopicLimits(10_000, "compact"))
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    clock[0] += REFRESH_AFTER if due != "no" else 1
    if due == "expired":
        assert gate.limits.unlearned({"t"}) == ["t"]
    gate.forget()
    producer.failures.append(PublishError("configuration of topic 't': broker gone"))
    with caplog.at_level(logging.WARNING, LOGGER):
        await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == 2
    [message] = _logged(caplog, logging.WARNING)
    assert "the configuration read before stays in use" in message
    assert list(gate.limits.keyless_refused({"t"})) == ["t"]
    await gate.limits.send(producer, SENDS, lambda: None)
    assert producer.sends == [[100], [20_000], [100]]
    clock[0] += RETRY_AFTER
    await gate.sendable(TERM, _CONN, producer, [_row(3)])
    assert producer.reads == 3


@pytest.mark.parametrize("expired", [False, True])
async def test_topics_due_at_a_new_producer_life_get_the_first_reads_budget(
    expired: bool,
) -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _SlowProducer(clock, takes=0.0)
    claim = [_row_of(1, "a"), _row_of(2, "b")]
    await gate.sendable(TERM, _CONN, producer, claim)
    clock[0] += REFRESH_AFTER
    if expired:
        assert sorted(gate.limits.unlearned({"a", "b"})) == ["a", "b"]
    gate.forget()
    producer.takes = REREAD_BUDGET * 1.5  # more than reads again get
    await gate.sendable(TERM, _CONN, producer, claim)
    assert sorted(producer.read[2:]) == ["a", "b"]


async def test_a_read_is_not_started_with_too_little_of_its_budget_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With 10% of the 1 s left a read again was started and, a real one, timed out: a failed
    read (a back-off, a log line) where the next claim had time for it."""
    clock = [0.0]
    gate = _gate(clock)
    producer = _Stalling(clock)
    await gate.sendable(TERM, _CONN, producer, [_row_of(1, "a"), _row_of(2, "b")])
    producer.takes = REREAD_BUDGET * 0.9
    producer.stuck, producer.free = frozenset("abcd"), 1  # a real read takes real time
    clock[0] += REFRESH_AFTER
    with caplog.at_level(logging.INFO, LOGGER):
        await gate.sendable(TERM, _CONN, producer, [_row_of(3, "a"), _row_of(4, "b")])
    [read] = producer.read[2:]
    assert caplog.records == []  # the other not reached: due at the next claim
    assert gate.limits.unlearned({"a", "b"}) == list({"a", "b"} - {read})
    gate.limits.read_budget, producer.takes, producer.free = 0.05, 0.04, 1
    producer._limits["d"] = LOWERED
    with caplog.at_level(logging.WARNING, LOGGER):
        await gate.sendable(TERM, _CONN, producer, [_row_of(5, "c"), _row_of(6, "d")])
    [message] = _logged(caplog, logging.WARNING)
    assert "could not be read (TimeoutError: not read within 0.05s)" in message


async def test_a_read_a_refusal_asked_for_gets_the_first_reads_budget_before_reads_again() -> None:
    clock = [0.0]
    gate = _gate(clock)
    producer = _SlowProducer(clock, takes=0.0)
    claim = [_row_of(1, "a"), _row_of(2, "b")]
    await gate.sendable(TERM, _CONN, producer, claim)
    clock[0] += REFRESH_AFTER - 1
    gate.limits.refused([("b", TOO_LARGE)])
    clock[0] += 1  # a is due too
    producer.takes = REREAD_BUDGET * 1.5
    await gate.sendable(TERM, _CONN, producer, claim)
    assert producer.read[2:] == ["b", "a"]


async def test_a_read_again_refused_for_its_acl_leaves_the_topic_read_for_this_life() -> None:
    """It stayed among the topics due too (``_stale``) while counted as read."""
    clock = [0.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], LOWERED)
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    clock[0] += REFRESH_AFTER
    denied = PublishError("configuration of topic 't': denied", error="TOPIC_AUTHORIZATION_FAILED")
    producer.failures.append(denied)
    await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == 2
    assert gate.limits._stale == set()
    assert gate.limits.unlearned({"t"}) == []
    await gate.limits.send(producer, SENDS, lambda: None)
    assert producer.sends == [[100], [20_000], [100]]  # the read before stays in use


async def test_a_missing_acl_is_asked_again_as_a_read_would_be_and_said_again_once_lost_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before, a topic whose read was refused for its ACL was asked again only in the next
    producer life (days, maybe): an ACL granted meanwhile protected nothing until then."""
    clock = [0.0]
    gate = _gate(clock)
    denied = PublishError("denied", error="TOPIC_AUTHORIZATION_FAILED")
    producer = _FlakyProducer([denied, denied], LOWERED)
    with caplog.at_level(logging.WARNING, LOGGER):
        await gate.sendable(TERM, _CONN, producer, [_row(1)])
        clock[0] += REFRESH_AFTER - 1
        await gate.sendable(TERM, _CONN, producer, [_row(2)])
        assert producer.reads == 1
        clock[0] += 1
        await gate.sendable(TERM, _CONN, producer, [_row(3)])
        assert producer.reads == 2  # still refused: not said again
        assert len(_logged(caplog, logging.WARNING)) == 1
        clock[0] += REFRESH_AFTER
        await gate.sendable(TERM, _CONN, producer, [_row(4)])
        assert producer.reads == 3  # the ACL was granted: read, and its limit applies
        await gate.limits.send(producer, SENDS, lambda: None)
        assert producer.sends == [[100], [20_000], [100]]
        producer.failures.append(denied)
        clock[0] += REFRESH_AFTER
        await gate.sendable(TERM, _CONN, producer, [_row(5)])
    assert producer.reads == 4
    warned = _logged(caplog, logging.WARNING)
    assert len(warned) == 2
    assert all("needs DescribeConfigs" in m for m in warned)
    assert "the configuration read before stays in use" in warned[1]


@pytest.mark.parametrize(
    "failure",
    [PublishError("configuration of topic 't': broker gone"), TimeoutError("no answer in time")],
)
async def test_a_topic_never_read_asked_again_after_its_acl_is_not_said_read_before(
    caplog: pytest.LogCaptureFixture, failure: Exception
) -> None:
    """Asked again after a refused ACL, a read failing otherwise says nothing protects the
    topic (nothing was read) at WARNING: not the read-again text, which said a read was in use."""
    clock = [0.0]
    gate = _gate(clock)
    denied = PublishError("denied", error="TOPIC_AUTHORIZATION_FAILED")
    producer = _FlakyProducer([denied, failure], LOWERED)
    with caplog.at_level(logging.INFO, LOGGER):
        await gate.sendable(TERM, _CONN, producer, [_row(1)])
        clock[0] += REFRESH_AFTER
        await gate.sendable(TERM, _CONN, producer, [_row(2)])
    assert producer.reads == 2
    said = [r for r in caplog.records if "could not be read" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING]
    assert "read before stays in use" not in said[0].getMessage()
    assert gate.limits.unlearned({"t"}) == []  # backing off, as any failed first read
    clock[0] += RETRY_AFTER
    assert gate.limits.unlearned({"t"}) == ["t"]


async def test_a_new_producer_life_drops_what_it_cannot_use() -> None:
    """A refusal's read pending at forget() marked the first read of the new life as asked
    for (a later refusal waited RETRY_AFTER), and past marks and back-offs piled up."""
    clock = [1000.0]
    gate = _gate(clock)
    producer = _FlakyProducer([], DEFAULT)
    await gate.sendable(TERM, _CONN, producer, [_row(1)])
    gate.limits.refused([("t", TOO_LARGE)])
    producer.failures.append(PublishError("configuration of topic 'u': broker gone"))
    await gate.sendable(TERM, _CONN, producer, [_row_of(2, "u")])  # a failed first read
    clock[0] += RETRY_AFTER + 1
    gate.forget()
    assert (gate.limits._asked, gate.limits._marked, gate.limits._retry_at) == (set(), {}, {})
    await gate.sendable(TERM, _CONN, producer, [_row(3)])
    assert producer.reads == 3
    gate.limits.refused([("t", TOO_LARGE)])
    await gate.sendable(TERM, _CONN, producer, [_row(4)])
    assert producer.reads == 4
