"""How long the relay waits before counting the backlog again (the pure part of the sampler)."""

from __future__ import annotations

import pytest

from outboxkit.relay.status_sampler import DUTY, CountedShards, backlog_delay


def test_a_cheap_count_comes_every_interval() -> None:
    assert backlog_delay(1.0, 0.002) == 1.0
    assert backlog_delay(2.5, 0.0) == 2.5


@pytest.mark.parametrize("took", [0.06, 0.3, 1.5, 12.0])
def test_an_expensive_count_is_at_most_the_duty_share_of_its_cycle(took: float) -> None:
    delay = backlog_delay(1.0, took)
    assert delay > 1.0
    assert took / (took + delay) == pytest.approx(DUTY)


def test_the_delay_grows_with_what_the_count_took() -> None:
    delays = [backlog_delay(1.0, took) for took in (0.01, 0.1, 0.3, 3.0)]
    assert delays == sorted(delays)
    assert delays[-1] > delays[0]


def test_a_shard_is_counted_at_once_when_new_here_or_when_its_holder_goes() -> None:
    counted = CountedShards()
    assert counted.needs_count(0, active=True)  # never counted here
    counted.counted(0, active=True)
    assert not counted.needs_count(0, active=True)
    assert counted.needs_count(0, active=False)  # held when counted, nobody holds it now
    counted.counted(1, active=False)
    assert not counted.needs_count(1, active=False)  # counted while unheld: on the schedule
    assert not counted.needs_count(1, active=True)
    assert counted.forget(1)
    assert not counted.forget(1)  # dropped once
    assert 1 not in counted
    assert 0 in counted
