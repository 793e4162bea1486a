"""The benchmarks' pause detector: a wall clock that jumps against the monotonic clock (a paused
VM) marks the figure measured across it; NTP-sized drift does not."""

from __future__ import annotations

import pytest

from benchmarks import pause_watch


class Clocks:
    def __init__(self) -> None:
        self.wall, self.mono = 1_000_000.0, 50.0

    def watch(self) -> pause_watch.PauseWatch:
        return pause_watch.PauseWatch(lambda: self.wall, lambda: self.mono)


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


def test_a_pause_is_reported_once_under_the_figure_it_spoiled(
    clocks: Clocks, capsys: pytest.CaptureFixture[str]
) -> None:
    watch = clocks.watch()
    clocks.wall += 10.0
    clocks.mono += 10.0
    watch.warn()
    assert capsys.readouterr().out == ""
    clocks.wall += 22.5  # resumed: the monotonic clock stood still
    watch.warn()
    assert "jumped +22.5s" in capsys.readouterr().out
    watch.warn()  # the next figure is clean again
    assert capsys.readouterr().out == ""
    assert watch.total == pytest.approx(22.5)


def test_drift_below_the_threshold_is_not_a_pause(clocks: Clocks) -> None:
    watch = clocks.watch()
    clocks.mono += 60.0
    clocks.wall += 60.03  # a minute of NTP slewing at its fastest
    assert watch.take() == pytest.approx(0.03)
    assert watch.total == 0.0
