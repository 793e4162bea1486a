"""LimitedLines: a failure's repeated lines, and its end (the consumer's database-away lines;
the loop's use is in test_inbox_guard.py)."""

from __future__ import annotations

import logging
import uuid

import pytest

from outboxkit.log_limit import LimitedLines
from tests.support.clock import Clock

pytestmark = pytest.mark.unit


def _lines(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name]


def test_the_end_of_a_failure_shows_what_was_not_counted_yet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    name, clock = f"outboxkit.test-{uuid.uuid4().hex[:6]}", Clock()
    lines = LimitedLines(logging.getLogger(name), clock=clock)
    with caplog.at_level(logging.INFO, logger=name):
        lines.end(logging.INFO, "over after %.0f s")  # no failure: nothing to say
        for n in range(5):
            lines.log(logging.ERROR, "away", "record %d failed: %s", n, "refused")
            clock.now += 1
        lines.log(logging.WARNING, "batch", "batch of %d failed", 3)
        lines.end(logging.INFO, "over after %.0f s")  # nothing worked again yet: not over
        lines.answered()
        lines.end(logging.INFO, "over after %.0f s")
        lines.log(logging.ERROR, "away", "record %d failed: %s", 9, "refused")  # a new failure
    assert _lines(caplog, name) == [
        "record 0 failed: refused",
        "batch of 3 failed",
        "record 4 failed: refused (3 similar lines suppressed over 4 s)",
        "over after 5 s",
        "record 9 failed: refused",
    ]


def test_exc_info_goes_with_its_own_line_only(caplog: pytest.LogCaptureFixture) -> None:
    name, clock = f"outboxkit.test-{uuid.uuid4().hex[:6]}", Clock()
    lines = LimitedLines(logging.getLogger(name), clock=clock)
    with caplog.at_level(logging.INFO, logger=name):
        for _ in range(2):
            try:
                raise ConnectionError("reset")
            except ConnectionError:
                lines.log(logging.ERROR, "away", "failed", exc_info=True)
        lines.answered()
        lines.end(logging.INFO, "over after %.0f s")
    shown = [r for r in caplog.records if r.name == name]
    assert [r.exc_info is not None for r in shown] == [True, False, False]


def test_a_line_names_the_function_that_logged_it(caplog: pytest.LogCaptureFixture) -> None:
    name = f"outboxkit.test-{uuid.uuid4().hex[:6]}"
    lines = LimitedLines(logging.getLogger(name), clock=Clock())
    with caplog.at_level(logging.INFO, logger=name):
        lines.log(logging.ERROR, "away", "failed")
        lines.answered()
        lines.end(logging.INFO, "over after %.0f s")
    functions = [r.funcName for r in caplog.records if r.name == name]
    assert functions == ["test_a_line_names_the_function_that_logged_it"] * 2


def test_a_failure_that_comes_and_goes_ends_once_it_stays_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An overloaded server refusing a connection now and then: one failure, not an end line
    and a first line each time; it ends once nothing failed for ``quiet`` seconds."""
    name, clock = f"outboxkit.test-{uuid.uuid4().hex[:6]}", Clock()
    lines = LimitedLines(logging.getLogger(name), clock=clock)
    with caplog.at_level(logging.INFO, logger=name):
        for _ in range(10):  # fails, works, fails, works ... a second apart
            lines.log(logging.ERROR, "away", "too many connections")
            clock.now += 0.5
            lines.answered()
            lines.end(logging.INFO, "over after %.0f s", quiet=5.0)
            clock.now += 0.5
        clock.now += 5.0  # the last failure was 5.5 s ago, the first success after it 5 s ago
        lines.end(logging.INFO, "over after %.0f s", quiet=5.0)
    assert _lines(caplog, name) == [
        "too many connections",
        "too many connections (8 similar lines suppressed over 9 s)",
        "over after 10 s",  # from the first line to the first success after the last one
    ]


def test_the_first_lines_of_a_failure_can_all_be_shown(caplog: pytest.LogCaptureFixture) -> None:
    """A start-up wait shows its back-off growing, then one line a minute; a new failure after
    the end shows its first lines again. The line names its caller in either case."""
    name, clock = f"outboxkit.test-{uuid.uuid4().hex[:6]}", Clock()
    lines = LimitedLines(logging.getLogger(name), shown_in_full=3, clock=clock)
    with caplog.at_level(logging.INFO, logger=name):
        for delay in (1, 2, 4, 8, 8, 8, 8, 8, 8, 8, 8, 8):  # 73 s
            lines.log(logging.WARNING, "away", "waiting; retrying in %ds", delay)
            clock.now += delay
        lines.answered()
        lines.end(logging.INFO, "over after %.0f s")
        lines.log(logging.WARNING, "away", "waiting; retrying in %ds", 1)
        lines.log(logging.WARNING, "away", "waiting; retrying in %ds", 2)
    assert _lines(caplog, name) == [
        "waiting; retrying in 1s",
        "waiting; retrying in 2s",
        "waiting; retrying in 4s",
        "waiting; retrying in 8s",  # the first line the limit saw: the first of its kind
        "waiting; retrying in 8s (7 similar lines suppressed over 64 s)",
        "over after 79 s",
        "waiting; retrying in 1s",
        "waiting; retrying in 2s",
    ]
    functions = {r.funcName for r in caplog.records if r.name == name}
    assert functions == {"test_the_first_lines_of_a_failure_can_all_be_shown"}
