"""A hold whose whole log was replaced (a topic deleted and created again, or an unclean
truncation): the held record is gone, and the new log is read from its start.

Two signs, either enough: the log's end, read before the seek back, is at or below the held
offset; the record at the held offset is another one (its mark differs). A partition that goes
on below the held offset after the seek back only makes the seek back again: a live log does that
too when the client resets its position.
"""

from __future__ import annotations

from typing import Any

import pytest

from outboxkit.inbox.gate import PartitionGate, record_mark
from outboxkit.inbox.steps import LogBounds, Resume, Seek, Sql, Step, drive_sync
from outboxkit.kafka.api import ConsumedRecord
from tests.unit.test_inbox_core import Held, _record

pytestmark = pytest.mark.unit

TP = ("t", 0)
HEADERS = (("event-id", b"e"),)
MARK = record_mark(1, b"k", b"v", HEADERS)


def _held(gate: PartitionGate) -> None:
    gate.hold(TP, 5, due=10.0, event_id="e", mark=MARK)
    assert gate.due(10.0) == [(TP, 5)]


def test_an_offset_below_the_held_one_after_the_own_seek_seeks_back_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client resets its position on a live log too (an offset out of range for a moment):
    the held row must not end on that alone. The seek back is made again at once (the bounds
    read first), and what came below the held offset is dropped."""
    gate = PartitionGate()
    _held(gate)
    assert not gate.accept(TP, 2)  # not sought by this client (a rejoin's new member): waits
    gate.sought(TP)
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        assert not gate.accept(TP, 0)
        assert not gate.accept(TP, 1)  # not resumed any more: dropped, quietly
    assert gate.held == frozenset({TP})
    assert gate.take_gone() == []
    assert caplog.messages == [
        "t/0: after the seek back to held offset 5 the partition went on at 0; seeking back again"
    ]
    assert gate.due(11.0) == [(TP, 5)]  # at once
    gate.sought(TP)
    assert gate.accept(TP, 5, MARK)  # the held record itself: the hold ends as before
    assert gate.held == frozenset()
    assert gate.take_gone() == []


def test_another_record_at_the_held_offset_rewinds_to_the_log_start() -> None:
    gate = PartitionGate()
    _held(gate)
    gate.sought(TP)
    other = record_mark(2, b"k", b"v", HEADERS)
    assert not gate.accept(TP, 5, other)
    assert not gate.accept(TP, 6)  # nothing of the partition runs before the rewind
    [gone] = gate.take_gone()
    assert gone.replaced
    assert gate.due(11.0) == [(TP, 5)]  # at once
    hold = gate.get(TP)
    assert hold is not None
    assert hold.rewind
    gate.restart(TP, 0, 9)
    assert gate.held == frozenset()
    assert gate.take_gone() == []  # reported once
    assert gate.accept(TP, 0)


def test_the_held_record_itself_ends_the_hold_as_before() -> None:
    gate = PartitionGate()
    _held(gate)
    gate.sought(TP)
    assert gate.accept(TP, 5, record_mark(1, b"k", b"v", HEADERS))
    assert gate.held == frozenset()
    assert gate.take_gone() == []


def test_a_carried_rewind_is_not_taken_as_resumed() -> None:
    gate = PartitionGate()
    _held(gate)
    gate.sought(TP)
    gate.accept(TP, 5, b"other")
    [carried] = gate.carry({TP}, now=20.0).values()
    assert (carried.rewind, carried.resumed, carried.sought) == (True, False, False)


class Recreated(Held):
    """The held partition's log now ends at ``end`` (its topic created again)."""

    def __init__(self, end: int) -> None:
        super().__init__()
        self.end = end

    def answer(self, step: Step) -> Any:
        if isinstance(step, LogBounds):
            return (0, self.end)
        return super().answer(step)


def _gone_reasons(held: Held) -> list[str]:
    return [
        str(s.params["error"])
        for s in held.script.steps
        if isinstance(s, Sql) and s.query.name == "abandon_gone"
    ]


def test_a_log_ending_at_or_below_the_held_offset_is_read_from_its_start() -> None:
    held = Recreated(end=2)
    held.hold()
    held.polls = [[_record(0, 0)], [_record(0, 1)], []]
    for _ in range(3):
        drive_sync(held.loop.poll_once(), held.script)
    assert held.after_resume()[:2] == ["Seek", "Resume"]
    assert Seek(("orders", 0), 0) in held.script.steps
    assert [offset for offset, _ in held.seen] == [5, 0, 1]
    assert _gone_reasons(held) == [
        "its record (orders/0 at offset 5) left the log (its topic deleted and created again,"
        " or the log truncated) while held for a retry"
    ]


def test_a_log_past_the_held_offset_with_another_record_there_is_read_from_its_start() -> None:
    held = Recreated(end=8)
    held.hold()
    other: ConsumedRecord = _record(0, 5)._replace(value=b'{"new": 1}')
    held.polls = [[other, _record(0, 6)], [_record(0, 0)], [_record(0, 1)], []]
    for _ in range(5):
        drive_sync(held.loop.poll_once(), held.script)
    seeks = [s for s in held.script.steps if isinstance(s, Seek)]
    assert seeks[-2:] == [Seek(("orders", 0), 5), Seek(("orders", 0), 0)]
    assert Resume([("orders", 0)]) in held.script.steps
    assert [offset for offset, _ in held.seen] == [5, 0, 1]
    assert len(_gone_reasons(held)) == 1


class Bounds(Held):
    """The held partition's log bounds read as ``bounds`` (whatever a client answered)."""

    def __init__(self, bounds: tuple[int, int]) -> None:
        super().__init__()
        self.bounds = bounds

    def answer(self, step: Step) -> Any:
        if isinstance(step, LogBounds):
            return self.bounds
        return super().answer(step)


@pytest.mark.parametrize("bounds", [(-1, -1), (0, -1001), (-1001, -1001), (9, 3)])
def test_bounds_that_are_no_logs_are_taken_as_not_read(bounds: tuple[int, int]) -> None:
    """A logical offset (-1, -1001) or a start past the end said nothing about the log: taken
    for an end at or below the held offset, it ended a live record's row ``dead``."""
    held = Bounds(bounds)
    held.hold()
    held.polls = [[_record(0, 5)], []]
    for _ in range(2):
        drive_sync(held.loop.poll_once(), held.script)
    assert held.after_resume()[:2] == ["Seek", "Resume"]
    assert Seek(("orders", 0), 0) not in held.script.steps
    assert [offset for offset, _ in held.seen] == [5, 5]
    assert _gone_reasons(held) == []


def test_a_live_log_restarting_below_the_held_offset_ends_nothing() -> None:
    """After the seek back the client went on at 0 (its position reset on a live log): the
    seek back is made again, and the held record runs when it comes."""
    held = Recreated(end=8)
    held.hold()
    held.polls = [[_record(0, 0), _record(0, 1)], [_record(0, 5)], []]
    for _ in range(4):
        drive_sync(held.loop.poll_once(), held.script)
    seeks = [s for s in held.script.steps if isinstance(s, Seek)]
    assert seeks[-2:] == [Seek(("orders", 0), 5), Seek(("orders", 0), 5)]
    assert [offset for offset, _ in held.seen] == [5, 5]
    assert _gone_reasons(held) == []
