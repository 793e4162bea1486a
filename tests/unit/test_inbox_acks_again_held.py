"""Records held for their acknowledgement: what happens to the hold when the record leaves the
log, when a rebalance runs during the batch, and to a retry behind it; failure counts that
outlive rebalances (bounded); a duplicate's outcome as it was before acknowledgements; the
time a round of gone records' acknowledgements may take.

The plans run against the scripted :class:`~tests.unit.test_inbox_acks_again.Stack`.
"""

from __future__ import annotations

from typing import Any

import pytest

from outboxkit.errors import PublishError
from outboxkit.inbox import Envelope, EventRegistry, InboxSettings, OutcomeKind, RetryPolicy
from outboxkit.inbox import acks as acks_module
from outboxkit.inbox.acks import GONE_ACK_ATTEMPTS, Acknowledger, HeldAck
from outboxkit.inbox.batch import deliver_batch
from outboxkit.inbox.delivery import InboxCore
from outboxkit.inbox.gate import Gone, PartitionGate, end_gone
from outboxkit.inbox.loop import ConsumerLoop
from outboxkit.inbox.loop_options import ERROR_RETRY_SECONDS, LoopOptions
from outboxkit.inbox.outcome import Outcome, Recorded
from outboxkit.inbox.steps import Publish, Resume, Seek, Step, drive_sync
from tests.unit.test_inbox_acks_again import (
    ACKS,
    DRIVERS,
    MODES,
    P0,
    P1,
    Row,
    Stack,
    _drive,
    _loop,
    _record,
)
from tests.unit.test_inbox_core import Cancelled, _core

pytestmark = pytest.mark.unit


# -- a held acknowledgement whose record left the log --------------------------------------------
@DRIVERS
@MODES
def test_a_record_held_for_its_acknowledgement_that_left_the_log_is_acknowledged_from_the_hold(
    driver: str, batched: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """e1's acknowledgement failed, so 5 is held; 5 leaves the log meanwhile and the seek back
    brings 6. No delivery will acknowledge e1 again: the acknowledgement kept with the hold is
    published, before 6 is processed and committed past it, and its failure count dropped."""
    loop, now = _loop(batched)
    stack = Stack(polls=[[_record(5, "e1")], [_record(6, "e2")]])
    stack.publish_errors.append(PublishError("broker away"))
    drive = _drive(driver)
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        drive(loop.poll_batch(), stack)
        now[0] += ERROR_RETRY_SECONDS
        drive(loop.poll_batch(), stack)  # 6 comes: 5 is gone
    first, again, e2 = stack.acks()
    assert (again["event_id"], e2["event_id"]) == ("e1", "e2")
    names = stack.names()
    assert names.index("Commit") > max(i for i, n in enumerate(names) if n == "Publish")
    assert first == again  # the acknowledgement whose publish failed, as it was
    assert (again["state"], again["attempts"], again["offset"]) == ("succeeded", 1, 5)
    assert stack.commits() == [{P0: 7}]
    assert stack.rows["e1"].state == "succeeded"  # a finished event: its row is left alone
    assert loop.acks is not None
    assert loop.acks.failures == {}
    assert [r for r in caplog.records if r.levelname == "ERROR"] == []


def test_a_held_acknowledgement_whose_record_left_the_log_is_given_up_after_its_tries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop, now = _loop(batched=False)
    stack = Stack(polls=[[_record(5, "e1")], [_record(6, "e2")]])
    stack.publish_errors.append(PublishError("broker away"))
    drive_sync(loop.poll_batch(), stack)
    now[0] += ERROR_RETRY_SECONDS
    stack.publish_errors.extend(PublishError("broker away") for _ in range(GONE_ACK_ATTEMPTS))
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        drive_sync(loop.poll_batch(), stack)  # 6 comes: 5 is gone
    assert [b["event_id"] for b in stack.acks()] == ["e1"] + ["e1"] * GONE_ACK_ATTEMPTS + ["e2"]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        f"acknowledgement for e1 (orders/0 at offset 5) given up after {GONE_ACK_ATTEMPTS}"
        " failed publish(es): broker away; its outcome is in the database: outboxkit inbox show"
        " --consumer c --event-id e1"
    ]
    assert loop.acks is not None
    assert loop.acks.failures == {}


def test_a_held_acknowledgement_goes_over_a_refused_seek_and_a_new_client() -> None:
    """The hold keeps its acknowledgement through refused seeks back and the rejoin's carry."""
    held = HeldAck("e1", (b"e1", b"{}", []))
    gate = PartitionGate()
    gate.hold(P0, 5, 1000.0, None, held)
    assert gate.due(1000.0) == [(P0, 5)]
    gate.seek_failed(P0, 1000.0)
    carried = gate.carry({P0}, 1002.0)
    new = PartitionGate()
    new.restore(P0, carried[P0])
    assert new.accept(P0, 7)  # 5 is gone
    assert new.take_gone() == [Gone(P0, 5, "e1", held)]


# -- a rebalance during the batch ---------------------------------------------------------------
class RebalancingStack(Stack):
    """Runs the rebalance callbacks while a record is settled (its acknowledgement published,
    or, not tried, its hold's seek back), as aiokafka may at any await: ``revoke_at`` revokes
    every partition, ``assign_at`` assigns them back."""

    def __init__(self, loop: ConsumerLoop, revoke_at: str, assign_at: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.loop, self.moments = loop, {revoke_at: "revoke", assign_at: "assign"}
        if revoke_at == assign_at:
            self.moments[revoke_at] = "both"

    def __call__(self, step: Step) -> Any:
        settling = None
        if isinstance(step, Publish) and step.key is not None:
            settling = step.key.decode()
        elif isinstance(step, Seek) and step.partition == P1:
            settling = "e3"  # the batch's one record of P1
        if settling is not None:
            moment = self.moments.pop(settling, None)
            if moment in ("revoke", "both"):
                self.loop.on_revoke([P0, P1])
            if moment in ("assign", "both"):
                self.loop.on_assign([P0, P1])
        return super().__call__(step)


@pytest.mark.parametrize(("revoke_at", "assign_at"), [("e3", "e3"), ("e1", "e1")])
def test_a_rebalance_during_the_batch_does_not_commit_past_a_record_held_for_its_ack(
    revoke_at: str, assign_at: str
) -> None:
    """e1's acknowledgement fails; the partitions are revoked and assigned again during e1's
    own publish, or before e3 settles (while e3's record is held: its publish is not tried):
    e2 is not committed past the unacknowledged e1 (the new assignment starts at the committed
    offset, e1 comes again)."""
    loop, _ = _loop(batched=True)
    batch = [_record(5, "e1"), _record(0, "e3", partition=1), _record(6, "e2")]
    stack = RebalancingStack(loop, revoke_at, assign_at, polls=[batch])
    stack.publish_errors.append(PublishError("broker away"))  # e1's
    drive_sync(loop.poll_batch(), stack)
    assert stack.moments == {}  # the rebalance happened
    assert [b["event_id"] for b in stack.acks()] == ["e1"]  # e3's not tried once e1's failed
    assert stack.commits() == []


# -- a retry behind a record held for its acknowledgement ----------------------------------------
def _loop_with_back_off(seconds: float) -> tuple[ConsumerLoop, list[float]]:
    registry = EventRegistry()
    registry.register(Cancelled)
    policy = RetryPolicy(max_attempts=5, initial_delay=seconds, max_delay=seconds)
    settings = InboxSettings(consumer="c", registry=registry, policy=policy)
    core = InboxCore(settings, lambda e, c, s: None, coroutines=False)
    now = [1000.0]
    options = LoopOptions(topics=["orders"], acks_topic=ACKS, batch_max_records=5)
    return ConsumerLoop(core, options, clock=lambda: now[0]), now


def test_a_retry_behind_a_record_held_for_its_ack_keeps_its_back_off() -> None:
    """e2 fails (back-off 60 s) behind e1, whose acknowledgement failed (1 s): the partition
    resumes after the longer of the two, or e2's handler would run again after 1 s."""
    loop, now = _loop_with_back_off(60.0)
    stack = Stack(polls=[[_record(5, "e1"), _record(6, "e2")]], failing={"e2"})
    stack.publish_errors.append(PublishError("broker away"))
    drive_sync(loop.poll_batch(), stack)
    runs = stack.handler_runs()
    stack.failing.clear()
    now[0] += 59.0
    drive_sync(loop.poll_batch(), stack)
    assert "Resume" not in stack.names()
    assert (stack.handler_runs(), stack.rows["e2"].state) == (runs, "processing")
    now[0] += 1.0
    stack.polls.append([_record(5, "e1"), _record(6, "e2")])  # what the seek back delivers
    drive_sync(loop.poll_batch(), stack)  # e1, a duplicate, acknowledged
    drive_sync(loop.poll_batch(), stack)  # e2, a takeover, runs alone
    assert sum(isinstance(s, Resume) for s in stack.steps) == 1
    assert stack.rows["e2"].state == "succeeded"
    assert stack.commits() == [{P0: 6}, {P0: 7}]


# -- failure counts outlive rebalances, bounded --------------------------------------------------
@MODES
def test_acknowledgement_failures_are_counted_across_rebalances(batched: bool) -> None:
    """A rebalance between the failures does not start the count again: the bound is reached
    (else frequent rebalances would hold the partition for as long as the acks topic fails)."""
    loop, now = _loop(batched, bound=2)
    stack = Stack(polls=[[_record(5, "e1")], [_record(5, "e1")]])
    stack.publish_errors.extend(PublishError("timeout") for _ in range(2))
    drive_sync(loop.poll_batch(), stack)
    loop.on_revoke([P0, P1])
    loop.on_assign([P0, P1])
    now[0] += ERROR_RETRY_SECONDS
    drive_sync(loop.poll_batch(), stack)
    assert stack.commits() == [{P0: 6}]  # given up after 2 failures
    assert loop.acks is not None
    assert loop.acks.failures == {}


def test_the_failure_counts_kept_are_bounded_the_oldest_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(acks_module, "ACK_FAILURES_KEPT", 3)
    acknowledger = Acknowledger("c", ACKS, attempts=5)
    stack = Stack(publish_errors=[PublishError("timeout") for _ in range(5)])
    for offset in (1, 2, 3, 1, 4):  # 1 fails again: counted as the newest
        env = Envelope.from_record(_record(offset, f"e{offset}"))
        drive_sync(acknowledger.acknowledge(env, Outcome.succeeded(f"e{offset}", 1)), stack)
    assert acknowledger.failures == {("orders", 0, 3): 1, ("orders", 0, 1): 2, ("orders", 0, 4): 1}


# -- a duplicate's outcome -----------------------------------------------------------------------
@DRIVERS
@MODES
def test_a_duplicates_outcome_is_the_plain_duplicate(driver: str, batched: bool) -> None:
    """What ``Inbox.process()`` and the poll return, with or without an acks topic: no attempts,
    no error (a succeeded event's row may keep an earlier attempt's); the recorded outcome,
    for the acknowledgement, is not compared."""
    env = Envelope.from_record(_record(5, "e1"))
    stack = Stack(rows={"e1": Row("succeeded", 2, "TimeoutError: attempt 1")})
    if batched:
        plan = deliver_batch(_core(), [env], lambda tp: False, lambda *a: None)
        [(_, outcome)] = _drive(driver)(plan, stack).outcomes
    else:
        outcome = _drive(driver)(_core().deliver(env), stack)
    assert outcome == Outcome(OutcomeKind.DUPLICATE, "e1")
    assert (outcome.attempts, outcome.error) == (0, None)
    assert outcome.recorded == Recorded("succeeded", 2, "TimeoutError: attempt 1")


# -- one round of gone records' acknowledgements ---------------------------------------------------
def test_a_round_of_gone_records_acknowledgements_shares_one_budget_of_tries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each try may wait out the sender's timeout with no poll in between: however many
    records left the log, a round fails at most ``GONE_ACK_ATTEMPTS`` publishes (else several
    could outlast ``max.poll.interval.ms``); the rest are given up untried, with an error."""
    stack = Stack(rows={e: Row("processing", 2) for e in ("e1", "e2", "e3")})
    stack.publish_errors.extend(PublishError("broker away") for _ in range(9))
    gone = [Gone(P0, 5, "e1"), Gone(P1, 7, "e2"), Gone(P0, 9, "e3")]
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        drive_sync(end_gone(gone, _core().statements, ACKS), stack)
    assert {e: r.state for e, r in stack.rows.items()} == dict.fromkeys(["e1", "e2", "e3"], "dead")
    assert [b["event_id"] for b in stack.acks()] == ["e1"] * GONE_ACK_ATTEMPTS
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert [e.split(": broker away")[0] for e in errors] == [
        f"acknowledgement for e1 (orders/0 at offset 5) given up after {GONE_ACK_ATTEMPTS}"
        " failed publish(es)",
        "acknowledgement for e2 (orders/1 at offset 7) given up untried (publishes just failed)",
        "acknowledgement for e3 (orders/0 at offset 9) given up untried (publishes just failed)",
    ]


# -- no publish tried again before a poll; a carried hold's acknowledgement; a stop ------------
def test_one_by_one_no_acknowledgement_is_tried_again_before_the_next_poll() -> None:
    """Records of two partitions buffered, the acks topic failing: each try may wait out the
    sender's timeout, so after one failed the other's record is held untried (not counted),
    and both come again once a poll came and their back-off ran out."""
    loop, now = _loop(batched=False)
    first = [_record(0, "e0", partition=0), _record(0, "e1", partition=1)]
    stack = Stack(polls=[first, list(first)])
    stack.publish_errors.append(PublishError("timeout"))
    drive_sync(loop.poll_batch(), stack)
    drive_sync(loop.poll_batch(), stack)
    assert [b["event_id"] for b in stack.acks()] == ["e0"]  # e1's not tried
    assert loop.acks is not None
    assert loop.acks.failures == {("orders", 0, 0): 1}  # e1's hold is not a failure
    assert stack.commits() == []
    now[0] += ERROR_RETRY_SECONDS
    for _ in range(3):
        drive_sync(loop.poll_batch(), stack)
    assert [b["event_id"] for b in stack.acks()] == ["e0", "e0", "e1"]
    assert stack.commits() == [{P0: 1}, {P1: 1}]


def test_a_carried_acknowledgement_hold_dropped_at_a_rejoin_is_published() -> None:
    """Another member committed past a record held here for its acknowledgement: the hold is
    dropped, and its acknowledgement published (a second copy at worst) instead of lost."""
    from outboxkit.inbox.steps import Committed

    class Rejoined(Stack):
        def __call__(self, step: Step) -> Any:
            if isinstance(step, Committed):
                self.steps.append(step)
                return {P0: 9}
            return super().__call__(step)

    loop, now = _loop(batched=False)
    stack = Rejoined()
    drive_sync(loop.poll_batch(), stack)  # joins the group
    record = (b"e1", b'{"event_id": "e1"}', [])
    loop.gate.hold(P0, 5, now[0] + 1, None, HeldAck("e1", record))
    drive_sync(loop.rejoin.run(loop, now[0]), stack)
    drive_sync(loop.poll_batch(), stack)
    assert "Committed" in stack.names()
    assert [s.key for s in stack.steps if isinstance(s, Publish)] == [b"e1"]
    assert loop.gate.held == frozenset()


def test_a_held_acknowledgement_found_gone_is_published_at_a_stop() -> None:
    """Found gone by a fetch whose records were not taken yet, the stop comes next: nothing
    would publish it later."""
    loop, now = _loop(batched=False)
    stack = Stack()
    drive_sync(loop.poll_batch(), stack)  # joins the group
    record = (b"e1", b'{"event_id": "e1"}', [])
    loop.gate.hold(P0, 5, now[0], None, HeldAck("e1", record))
    assert loop.gate.due(now[0]) == [(P0, 5)]
    assert loop.gate.accept(P0, 6)  # 5 left the log
    drive_sync(loop.close(), stack)
    assert [s.key for s in stack.steps if isinstance(s, Publish)] == [b"e1"]
