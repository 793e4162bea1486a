"""The consumer loop processes and commits only what this member owns, and checks the topics it
publishes to before it joins the group. Scripted executors stand in for the client seam."""

from __future__ import annotations

from typing import Any

import pytest

from outboxkit.errors import ConfigurationError
from outboxkit.inbox import loop as loop_module
from outboxkit.inbox.batch import BatchResult
from outboxkit.inbox.deadletter import DeadLetterCheck
from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.loop import ConsumerLoop
from outboxkit.inbox.loop_options import LoopOptions
from outboxkit.inbox.outcome import Outcome, OutcomeKind
from outboxkit.inbox.steps import Commit, Plan, Poll, Step, Subscribe, TopicExists, drive_sync
from tests.unit.test_inbox_core import ONE, Script, _core, _record

pytestmark = pytest.mark.unit

P0, P1 = ("orders", 0), ("orders", 1)


class Batches:
    """A loop over partitions 0 and 1 whose batches are recorded, each record succeeding;
    ``during_batch`` runs inside the batch (a rebalance while it is processed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, polls: list[list[Any]]) -> None:
        options = LoopOptions(topics=["orders"], batch_max_ms=5)
        self.loop = ConsumerLoop(_core(), options, clock=lambda: 1000.0)  # time to top up
        self.polls = polls
        self.on_poll: dict[int, Any] = {}  # poll number -> what runs inside it
        self.during_batch: Any = None
        self.batches: list[list[tuple[int, int]]] = []
        monkeypatch.setattr(loop_module, "deliver_batch", self.deliver_batch)
        self.script = Script(self.answer)

    def answer(self, step: Step) -> Any:
        if isinstance(step, Subscribe):
            step.on_assign([P0, P1])
            return None
        if isinstance(step, Poll):
            number = sum(isinstance(s, Poll) for s in self.script.steps)
            if number in self.on_poll:
                self.on_poll[number]()
            return self.polls.pop(0) if self.polls else []
        return ONE

    def deliver_batch(self, core: Any, envs: list[Envelope], *args: Any) -> Plan[BatchResult]:
        yield from ()
        self.batches.append([(e.partition, e.offset) for e in envs])
        if self.during_batch is not None:
            self.during_batch()
        return BatchResult([(e, Outcome(OutcomeKind.SUCCEEDED, "e", 1)) for e in envs], [])

    def commits(self) -> list[dict[tuple[str, int], int]]:
        return [dict(s.offsets) for s in self.script.steps if isinstance(s, Commit)]


def test_records_of_a_partition_revoked_during_the_top_up_poll_are_not_processed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch took p0's record, then topped up: in that poll a rebalance took p0 (its
    new owner may be claiming the record already). The record is dropped, not claimed and
    run; no offset of p0 is committed (confluent-kafka would accept it and could rewind the
    new owner)."""
    batches = Batches(monkeypatch, [[_record(0, 1)], [_record(1, 7)]])
    batches.on_poll[2] = lambda: batches.loop.on_revoke([P0])
    outcomes = drive_sync(batches.loop.poll_batch(), batches.script)
    assert batches.batches == [[(1, 7)]]
    assert [o.kind for o in outcomes] == [OutcomeKind.SUCCEEDED]
    assert batches.commits() == [{P1: 8}]


def test_a_batch_whose_every_record_was_revoked_in_the_top_up_poll_is_no_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batches = Batches(monkeypatch, [[_record(0, 1), _record(0, 2)], []])
    batches.on_poll[2] = lambda: batches.loop.on_revoke([P0])
    assert drive_sync(batches.loop.poll_batch(), batches.script) == []
    assert batches.batches == []
    assert batches.commits() == []


def test_no_offset_is_committed_for_a_partition_revoked_while_its_batch_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiokafka runs its rebalance listener in its coordinator's task, so a partition can be
    revoked at any await of a batch. Its settled record's offset is not committed: the new
    owner's position is not this member's to move (aiokafka raises IllegalStateError)."""
    batches = Batches(monkeypatch, [[_record(0, 1), _record(1, 7)], []])
    batches.during_batch = lambda: batches.loop.on_revoke([P0])
    outcomes = drive_sync(batches.loop.poll_batch(), batches.script)
    assert [o.kind for o in outcomes] == [OutcomeKind.SUCCEEDED] * 2  # durable in the database
    assert batches.commits() == [{P1: 8}]


# -- the start-up check of the topics published to ----------------------------------------------
def _checked(mode: DeadLetterCheck, existing: set[str]) -> tuple[ConsumerLoop, Script]:
    loop = ConsumerLoop(
        _core(),
        LoopOptions(topics=["orders"], acks_topic="billing.acks", dead_letter_check=mode),
    )

    def answer(step: Step) -> Any:
        if isinstance(step, TopicExists):
            return step.topic in existing
        return None

    return loop, Script(answer)


def _asked(script: Script) -> list[str]:
    return [s.topic for s in script.steps if isinstance(s, TopicExists)]


def test_a_missing_acks_topic_stops_the_start_up_as_a_missing_dead_letter_topic_does() -> None:
    """Found only at run time, every outcome would wait for the producer's timeout (~30 s),
    holding its partition that long."""
    loop, script = _checked("fail", {"orders.dlq"})
    with pytest.raises(ConfigurationError, match=r"acks topic 'billing\.acks' does not exist"):
        drive_sync(loop.start(), script)
    assert _asked(script) == ["orders.dlq", "billing.acks"]
    assert not any(isinstance(s, Subscribe) for s in script.steps)  # never joined the group


def test_a_missing_acks_topic_is_a_warning_or_not_looked_for_as_dead_letter_check_says(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop, script = _checked("warn", set())
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        problems = drive_sync(loop.check_dead_letters(), script)
    assert [p.split(" does not exist")[0] for p in problems] == [
        "dead-letter topic 'orders.dlq'",
        "acks topic 'billing.acks'",
    ]
    assert problems == caplog.messages
    loop, script = _checked("off", set())
    assert drive_sync(loop.check_dead_letters(), script) == []
    assert _asked(script) == []
    loop, script = _checked("fail", {"orders.dlq", "billing.acks"})
    assert drive_sync(loop.check_dead_letters(), script) == []


def test_the_acks_topic_is_checked_without_dead_letters_too() -> None:
    loop = ConsumerLoop(
        _core(), LoopOptions(topics=["orders"], dead_letter=None, acks_topic="billing.acks")
    )
    script = Script(lambda step: False if isinstance(step, TopicExists) else None)
    with pytest.raises(ConfigurationError, match="acks topic"):
        drive_sync(loop.check_dead_letters(), script)
    assert _asked(script) == ["billing.acks"]
