"""How long the relay waits before counting the backlog again (the pure part of the sampler)."""

from __future__ import annotations

import pytest

from outboxkit.relay.status_sampler import DUTY, backlog_delay


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


def test_a_process_counting_part_of_the_shards_waits_as_long_as_for_all_of_them() -> None:
    """Half the shards took half as long: the next count comes when one count of all of them
    would have, so two such processes together spend DUTY, not twice that."""
    assert backlog_delay(1.0, 0.15, 0.5) == pytest.approx(backlog_delay(1.0, 0.3))
    assert backlog_delay(1.0, 0.001, 0.25) == 1.0
