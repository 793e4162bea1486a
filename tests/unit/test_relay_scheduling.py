"""When the shard holder moves scheduled rows (``Scheduling``), with a pretend store and clock."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, cast

import pytest

from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.reader import Moves
from outboxkit.relay.scheduling import AHEAD_MARGIN_SECONDS, PASS_SECONDS, Scheduling
from outboxkit.settings import load_settings

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Store:
    """Answers each statement pair with the next (later, due[, held, released]) counts; each
    takes ``took`` seconds."""

    def __init__(self, clock: Clock, answers: list[tuple[int, ...]], took: float = 0.01) -> None:
        self.clock, self.answers, self.took, self.calls = clock, answers, took, 0

    async def schedule(
        self, conn: Any, term: Any, limit: int, ahead: float, *, now: Any = None
    ) -> Moves:
        self.calls += 1
        self.clock.now += self.took
        answer = self.answers.pop(0) if self.answers else ()
        return Moves(*answer, *(0,) * (4 - len(answer)))


def _term() -> LeaseTerm:
    return LeaseTerm("g", 0, "me", 1, 30.0, time.monotonic() + 30)


async def _pass(scheduling: Scheduling, store: Store) -> None:
    await scheduling.run_if_due(cast(Any, None), _term(), cast(Any, store), asyncio.Event())


async def test_a_pass_comes_at_once_then_once_an_interval() -> None:
    clock = Clock()
    scheduling, store = Scheduling(2.0, clock=clock, batch=10), Store(clock, [(3, 1)])
    await _pass(scheduling, store)
    assert (store.calls, scheduling.moved_later, scheduling.moved_due) == (1, 3, 1)
    clock.now += 1.5
    await _pass(scheduling, store)
    assert store.calls == 1  # not due yet
    clock.now += 0.6
    await _pass(scheduling, store)
    assert (store.calls, scheduling.passes) == (2, 2)


async def test_rows_moving_out_stop_when_the_pass_time_is_up() -> None:
    clock = Clock()
    full = [(10, 0)] * 100
    scheduling, store = Scheduling(2.0, clock=clock, batch=10), Store(clock, full, took=0.1)
    await _pass(scheduling, store)
    assert store.calls == math.ceil(PASS_SECONDS / 0.1)  # then the shard claims and publishes
    calls = store.calls
    await _pass(scheduling, store)  # behind: the next pass does not wait an interval
    assert store.calls > calls


async def test_rows_coming_back_all_come_back_in_the_pass_whatever_it_takes() -> None:
    """A row left out at its time would let newer rows of its key that are due go first: after
    a relay was away past many rows' times, all of them come back before its first claim."""
    clock = Clock()
    answers = [(10, 10)] * 9 + [(0, 3)]
    scheduling, store = Scheduling(2.0, clock=clock, batch=10), Store(clock, answers, took=0.1)
    await _pass(scheduling, store)
    assert (store.calls, scheduling.moved_due) == (10, 93)  # 1 s: past the pass's 0.25 s


async def test_a_pass_ends_when_a_statement_moves_less_than_a_batch_either_way() -> None:
    clock = Clock()
    answers = [(0, 10), (10, 4), (2, 0)]
    scheduling, store = Scheduling(2.0, clock=clock, batch=10), Store(clock, answers)
    await _pass(scheduling, store)
    assert (store.calls, scheduling.moved_later, scheduling.moved_due) == (3, 12, 14)
    await _pass(scheduling, store)
    assert store.calls == 3  # caught up: the next pass waits its interval


async def test_rows_held_behind_a_parked_key_move_as_rows_scheduled_for_later_do() -> None:
    """Rows to hold keep a pass going until its time is up (then the next comes before the next
    claim); rows let go all come back in the pass, like rows due."""
    clock = Clock()
    answers: list[tuple[int, ...]] = [(0, 0, 10, 0)] * 100
    scheduling, store = Scheduling(2.0, clock=clock, batch=10), Store(clock, answers, took=0.1)
    await _pass(scheduling, store)
    assert store.calls == math.ceil(PASS_SECONDS / 0.1)
    assert scheduling.moved_held == 10 * store.calls
    clock2 = Clock()
    back: list[tuple[int, ...]] = [(0, 0, 0, 10)] * 9 + [(0, 0, 0, 3)]
    scheduling, store = Scheduling(2.0, clock=clock2, batch=10), Store(clock2, back, took=0.1)
    await _pass(scheduling, store)
    assert (store.calls, scheduling.moved_released) == (10, 93)


async def test_a_walk_of_held_keys_goes_on_while_the_pass_time_allows_then_next_pass() -> None:
    """Policy 'wait': the walk that finds keys no parked row holds back any more is bounded by
    the pass's time and goes on in the next pass, an interval later (not before the next
    claim: a walk of many keys would else hold the shard's publishing)."""
    clock = Clock()
    walking: list[tuple[int, ...]] = [(0, 0, 0, 0, True)] * 100
    scheduling, store = Scheduling(2.0, clock=clock, batch=10), Store(clock, walking, took=0.1)
    await _pass(scheduling, store)
    assert store.calls == math.ceil(PASS_SECONDS / 0.1)
    calls = store.calls
    await _pass(scheduling, store)
    assert store.calls == calls  # the next pass waits its interval


async def test_under_the_skip_policy_the_walk_lets_every_held_row_go_in_the_pass() -> None:
    clock = Clock()
    going: list[tuple[int, ...]] = [(0, 0, 0, 3, True, True)] * 9 + [(0, 0, 0, 2)]
    scheduling, store = Scheduling(2.0, clock=clock, batch=10), Store(clock, going, took=0.1)
    await _pass(scheduling, store)
    assert (store.calls, scheduling.moved_released) == (10, 29)  # 1 s: past the pass's 0.25 s


def test_rows_come_back_ahead_of_their_time_by_more_than_a_pass_may_be_late() -> None:
    """Two intervals, the longest Kafka transaction (its claims run without a pass), and
    slack: a row back after its time would let newer rows of its key that are due go first."""
    settings = load_settings(overrides={"relay": {"poll_interval": 2.0, "transaction_max_ms": 800}})
    assert Scheduling.of(settings.relay).ahead == 2 * 2.0 + 0.8 + AHEAD_MARGIN_SECONDS
