"""The holds a rejoin carries over, against the group's committed offsets.

While this member rejoins, another member of the group may own a held partition, run the held
record and commit past it. The new client's first assignment reads the committed offsets of
the partitions whose holds it carries (a step of the plan, after the assignment, not in the
rebalance callback): a hold committed past is dropped, any other is restored, and a failed read
restores them all.
"""

from __future__ import annotations

from typing import Any

import pytest

from outboxkit.errors import PublishError
from outboxkit.inbox.rejoin import COMMITTED_READ_SECONDS
from outboxkit.inbox.steps import (
    CloseConsumer,
    Committed,
    Pause,
    Poll,
    Seek,
    Sql,
    Step,
    Subscribe,
)
from outboxkit.kafka.api import ConsumedRecord
from tests.unit.test_inbox_core import Script, _record
from tests.unit.test_inbox_seek_recovery import HELD, OTHER, Refusing

pytestmark = pytest.mark.unit

FAILURE = ("orders", 0, 5)  # the held record failed outside its handler twice before


class Joining(Refusing):
    """:class:`Refusing`, whose new client gets its first assignment in a poll, with records
    (as confluent-kafka's does), in a group whose committed offsets are ``committed`` (``None``:
    they cannot be read). Partition 1 is held too, its back-off far from over."""

    def __init__(self, committed: dict[tuple[str, int], int] | None) -> None:
        super().__init__()
        self.committed = committed
        self.fetched: list[list[ConsumedRecord]] = []  # what the new client's polls return
        self.replaced = False
        self.joined: Subscribe | None = None
        self.unassigned_polls = 0  # polls of the new client before its first assignment
        self.script = Script(self.joining)
        self.hold()
        self.loop.gate.hold(OTHER, 3, due=self.now + 100, event_id="o")
        self.loop.failures[FAILURE] = 2

    def joining(self, step: Step) -> Any:
        if isinstance(step, CloseConsumer):
            self.replaced = True
        if not self.replaced:
            return self.answer(step)
        if isinstance(step, Subscribe):
            self.joined = step  # no assignment yet: the group has not rebalanced
            return None
        if isinstance(step, Poll):
            if self.unassigned_polls:
                self.unassigned_polls -= 1
            elif self.joined is not None:
                joined, self.joined = self.joined, None
                joined.on_assign([HELD, OTHER])
            return self.fetched.pop(0) if self.fetched else []
        if isinstance(step, Committed):
            if self.committed is None:
                raise PublishError("reading the committed offsets failed: coordinator away")
            return {tp: o for tp, o in self.committed.items() if tp in step.partitions}
        return self.answer(step)

    def after_rejoin(self) -> list[Step]:
        close = self.script.names().index("CloseConsumer")
        return self.script.steps[close:]


def test_a_carried_hold_another_member_committed_past_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    joining = Joining({HELD: 8, OTHER: 6})  # the other member ran 0/5-0/7 and 1/3-1/5
    joining.fetched = [[_record(0, 8), _record(1, 6), _record(0, 9)]]
    with caplog.at_level("INFO", logger="outboxkit.inbox.consumer"):
        joining.refuse_until_rejoined()
        for _ in range(3):
            joining.poll()
    assert joining.seen[2:] == [(0, 8), (1, 6), (0, 9)]  # what the assigning poll fetched
    assert joining.loop.gate.held == frozenset()
    steps = joining.after_rejoin()
    assert Committed([HELD, OTHER], COMMITTED_READ_SECONDS) in steps
    assert not [s for s in steps if isinstance(s, Seek | Pause)]  # no seek back, no pause
    assert FAILURE not in joining.loop.failures
    assert not [m for m in caplog.messages if "is gone" in m]  # it did not leave the log
    assert any("another member committed offset 8 past held offset 5" in m for m in caplog.messages)
    # A held record that had left the log instead (the other member never ran it) ends dead:
    # the statement changes a row only while it still names the held record.
    ended = [s for s in steps if isinstance(s, Sql) and s.query.name == "abandon_gone"]
    assert [(s.params["event_id"], s.params["kafka_offset"]) for s in ended] == [
        ("e", 5),
        ("o", 3),
    ]


def test_a_carried_hold_at_the_committed_offset_is_restored() -> None:
    joining = Joining({HELD: 5, OTHER: 3})
    joining.fetched = [[], [], [_record(0, 5), _record(1, 3), _record(0, 6)]]
    joining.refuse_until_rejoined()
    steps = joining.after_rejoin()
    read = steps.index(Committed([HELD, OTHER], COMMITTED_READ_SECONDS))
    assert joining.loop.gate.held == frozenset({HELD, OTHER})
    assert steps[read + 1] == Pause([OTHER])  # its back-off runs on; the new client resumed it
    assert joining.loop.failures[FAILURE] == 2
    for _ in range(3):
        joining.poll()
    assert joining.seen[2:] == [(0, 5), (0, 6)]  # 1/3 waits for its back-off
    assert not [s for s in joining.after_rejoin() if isinstance(s, Seek)]


def test_a_failed_read_of_the_committed_offsets_restores_the_carried_holds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    joining = Joining(None)
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        joining.refuse_until_rejoined()
    assert joining.loop.gate.held == frozenset({HELD, OTHER})
    steps = joining.after_rejoin()
    assert steps[steps.index(Committed([HELD, OTHER], COMMITTED_READ_SECONDS)) + 1] == Pause(
        [OTHER]
    )
    assert joining.loop.failures[FAILURE] == 2
    assert (
        "reading the committed offsets of the held partitions failed (PublishError: reading the"
        " committed offsets failed: coordinator away); their holds are kept"
    ) in caplog.messages


def test_nothing_is_processed_before_the_new_clients_first_assignment(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Until it has one, the rejoin polls the new client itself, keeping what it fetches for
    after the carried holds were taken over (judged before, 0/8 would end the hold as gone)."""
    joining = Joining({HELD: 8})
    joining.unassigned_polls = 2
    joining.fetched = [[], [], [_record(0, 8)]]
    joining.refuse_until_rejoined()
    joining.poll()
    assert joining.loop.assigned == set()
    assert [type(s).__name__ for s in joining.after_rejoin()] == [
        "CloseConsumer",
        "Subscribe",
        "Poll",  # no assignment: nothing else happens
        "Poll",
    ]
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        joining.poll()  # assigned in this poll, which fetched 0/8
    assert joining.loop.assigned == {HELD, OTHER}
    assert joining.seen[2:] == [(0, 8)]
    assert joining.loop.gate.held == frozenset({OTHER})
    assert not [m for m in caplog.messages if "is gone" in m]


def test_aiokafka_reads_of_committed_offsets_are_not_left_running_after_one_fails() -> None:
    """One partition's read refused at once failed the call while the others kept running
    (aiokafka retries a retriable error for ever): each is now awaited, or cancelled at the
    bound."""
    import asyncio

    from aiokafka.errors import KafkaError

    from outboxkit.errors import PublishError
    from outboxkit.kafka.aiokafka_consumer import AiokafkaGroupConsumer
    from outboxkit.settings import KafkaSettings

    async def scenario() -> bool:
        started: list[asyncio.Task[None]] = []

        class Client:
            async def committed(self, tp: object) -> int:
                if getattr(tp, "partition", 0) == 0:
                    await asyncio.sleep(0)  # the other read has started by then
                    raise KafkaError("refused")
                started.append(asyncio.current_task())  # type: ignore[arg-type]
                await asyncio.Event().wait()  # a read that never ends
                return 0

        consumer = AiokafkaGroupConsumer(KafkaSettings(bootstrap="127.0.0.1:9"), "g")
        consumer._consumer = Client()
        with pytest.raises(PublishError, match="reading the committed offsets failed"):
            await consumer.committed([("t", 0), ("t", 1)], 0.2)
        await asyncio.sleep(0)  # a cancelled task ends at its next step
        return all(task.done() for task in started) and len(started) == 1

    assert asyncio.run(scenario())
