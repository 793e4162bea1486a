"""A held partition whose client keeps refusing the seek back to the held record.

Retrying the seek for ever would keep the partition paused for good. After
:data:`~outboxkit.inbox.gate.SEEK_ATTEMPTS` refusals in a row the consumer rejoins its group with
a new client, which starts every partition at its committed offset: never past the held record,
since offsets are committed only for settled records.
"""

from __future__ import annotations

from typing import Any

import pytest

from outboxkit.errors import PublishError
from outboxkit.inbox import Envelope, OutcomeKind
from outboxkit.inbox.gate import SEEK_ATTEMPTS, SEEK_RETRY_SECONDS, PartitionGate
from outboxkit.inbox.loop import ConsumerLoop
from outboxkit.inbox.loop_options import LoopOptions
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.rejoin import RESUBSCRIBE_RETRY_SECONDS
from outboxkit.inbox.steps import (
    CloseConsumer,
    Commit,
    Plan,
    Poll,
    Resume,
    Seek,
    Sleep,
    Step,
    Subscribe,
    drive_sync,
)
from outboxkit.kafka.api import ConsumedRecord
from tests.unit.test_inbox_core import ONE, Script, _core, _record

pytestmark = pytest.mark.unit

HELD = ("orders", 0)
OTHER = ("orders", 1)


def test_the_gate_asks_for_a_new_client_once_the_seek_failed_too_often(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = PartitionGate()
    gate.hold(HELD, 5, due=10.0, event_id="e")
    now = 10.0
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        for _ in range(SEEK_ATTEMPTS - 1):
            assert gate.due(now) == [(HELD, 5)]
            assert gate.seek_failed(HELD, now) is False  # try again shortly, still paused
            assert gate.next_due() == now + SEEK_RETRY_SECONDS
            now += SEEK_RETRY_SECONDS
        assert gate.due(now) == [(HELD, 5)]
        assert gate.seek_failed(HELD, now) is True
    assert caplog.messages[-1] == (
        f"orders/0: could not seek back to held offset 5 {SEEK_ATTEMPTS} times; rejoining the"
        " group with a new client, which delivers it again from the committed offset"
    )
    assert not gate.accept(HELD, 7)  # never moved past the held record meanwhile
    assert gate.held == frozenset({HELD})  # the rejoin's revocation forgets it
    gate.hold(HELD, 5, due=now, event_id="e")  # a new hold counts its refusals afresh
    assert gate.due(now) == [(HELD, 5)]
    assert gate.seek_failed(HELD, now) is False


class Refusing:
    """A consumer of partitions 0 and 1 (offsets committed every minute) whose client refuses
    every seek; record 0/5 fails once (retry in 10 s), everything else succeeds."""

    def __init__(self, **options: Any) -> None:
        self.now = 1000.0
        options = {"offset_commit_interval": 60.0, **options}
        self.loop = ConsumerLoop(_core(), LoopOptions(["orders"], **options), clock=self.clock)
        self.loop.core.deliver = self.deliver  # type: ignore[method-assign]
        self.polls: list[list[ConsumedRecord]] = [[_record(0, 5), _record(1, 3), _record(0, 6)]]
        self.seen: list[tuple[int, int]] = []
        self.subscribe_fails = 0
        self.subscribe_error: Exception = PublishError("Kafka consumer could not start: no broker")
        self.commit_fails = 0
        self.script = Script(self.answer)

    def clock(self) -> float:
        return self.now

    def answer(self, step: Step) -> Any:
        if isinstance(step, Subscribe):
            if self.subscribe_fails:
                self.subscribe_fails -= 1
                raise self.subscribe_error
            step.on_assign([HELD, OTHER])
            return None
        if isinstance(step, Poll):
            return self.polls.pop(0) if self.polls else []
        if isinstance(step, Seek):
            return False
        if isinstance(step, Commit) and self.commit_fails:
            self.commit_fails -= 1
            raise PublishError("offset commit failed: coordinator not available")
        return ONE

    def deliver(self, env: Envelope, *args: Any) -> Plan[Outcome]:
        yield from ()
        self.seen.append((env.partition, env.offset))
        if self.seen.count((0, 5)) == 1 and (env.partition, env.offset) == (0, 5):
            return Outcome(OutcomeKind.RETRY, "e", retry_in=10)
        return Outcome(OutcomeKind.SUCCEEDED, "e")

    def poll(self) -> OutcomeKind | None:
        outcome = drive_sync(self.loop.poll_once(timeout=0), self.script)
        return None if outcome is None else outcome.kind

    def hold(self) -> None:
        """0/5 fails and is held, 1/3 succeeds (settled, not committed yet)."""
        for _ in range(3):
            self.poll()
        assert self.seen == [(0, 5), (1, 3)]  # 0/6 was dropped with the hold
        assert self.loop.gate.held == frozenset({HELD})

    def refuse_until_rejoined(self) -> int:
        """Poll at every due resume until the client was replaced; the failed seeks."""
        for attempt in range(1, SEEK_ATTEMPTS + 1):
            due = self.loop.gate.next_due()
            assert due is not None, f"the hold ended after {attempt - 1} failed seeks"
            self.now = due
            self.poll()
            if "CloseConsumer" in self.script.names():
                return attempt
        raise AssertionError(f"still held after {SEEK_ATTEMPTS} failed seeks")


def test_a_client_refusing_every_seek_is_replaced_and_the_held_record_comes_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusing = Refusing()
    refusing.hold()
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        assert refusing.refuse_until_rejoined() == SEEK_ATTEMPTS
    steps = refusing.script.steps
    resumes = [s for s in steps if isinstance(s, Resume)]
    assert resumes == []  # a resume without the seek would go on past the held record
    seeks = [s for s in steps if isinstance(s, Seek)]
    assert seeks == [Seek(HELD, 5)] * (1 + SEEK_ATTEMPTS)  # the hold's own, then the resumes'
    # The settled offset of partition 1 and the held one of partition 0 (with none committed
    # yet the new member would start where auto.offset.reset says, with "latest" past it) are
    # committed before the client goes; then a new one.
    close = [type(s) for s in steps].index(CloseConsumer)
    assert [type(s) for s in steps[close - 1 : close + 2]] == [Commit, CloseConsumer, Subscribe]
    commit = steps[close - 1]
    assert isinstance(commit, Commit)
    assert commit.offsets == {OTHER: 4, HELD: 5}
    assert refusing.loop.gate.held == frozenset({HELD})  # the new client starts at it
    assert refusing.loop.assigned == {HELD, OTHER}
    assert any("rejoining the group with a new client" in m for m in caplog.messages)
    # The new member starts partition 0 at its committed offset, the held record.
    refusing.polls = [[_record(0, 5), _record(0, 6)]]
    refusing.poll()
    refusing.poll()
    assert refusing.seen == [(0, 5), (1, 3), (0, 5), (0, 6)]


def test_a_new_client_that_cannot_join_yet_is_joined_by_a_later_poll_of_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under ``run()`` a failed subscribe neither ends the consumer (a worker would exit, then
    crash-loop while Kafka is away) nor polls the closed client: it is tried again, backing off."""
    refusing = Refusing(batch_max_records=1)  # run() delivers through core.deliver
    refusing.hold()
    refusing.subscribe_fails = 2
    for _ in range(SEEK_ATTEMPTS - 1):
        refusing.now = refusing.loop.gate.next_due() or refusing.now
        refusing.poll()
    refusing.now = refusing.loop.gate.next_due() or refusing.now
    refusing.polls = [[], [_record(0, 5)]]
    steps = refusing.script.steps
    start = len(steps)

    rounds = iter(range(50))

    def stopped() -> bool:  # once the new client delivered the held record (or never)
        return len(refusing.seen) > 2 or next(rounds, None) is None

    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        drive_sync(refusing.loop.run(stopped), refusing.script)
    kinds = [type(s).__name__ for s in steps[start:] if not isinstance(s, Seek | Resume)]
    close = kinds.index("CloseConsumer")
    assert kinds[close : close + 6] == [
        "CloseConsumer",
        *["Subscribe", "Sleep"] * 2,  # refused twice: nothing polled meanwhile
        "Subscribe",
    ]
    sleeps = [s for s in steps[start:] if isinstance(s, Sleep)]
    assert [s.seconds for s in sleeps] == [RESUBSCRIBE_RETRY_SECONDS, 2 * RESUBSCRIBE_RETRY_SECONDS]
    assert refusing.seen[-1] == (0, 5)
    assert refusing.loop.assigned == {HELD, OTHER}
    assert (
        "rejoining the group failed (PublishError: Kafka consumer could not start: no broker);"
        f" nothing is consumed until it succeeds, trying again in {RESUBSCRIBE_RETRY_SECONDS:g} s"
    ) in caplog.messages
