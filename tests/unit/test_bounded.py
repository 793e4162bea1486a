"""Blocking calls given a deadline (outboxkit.bounded): values, errors, and a call that hangs."""

from __future__ import annotations

import threading

import pytest

from outboxkit.bounded import BoundedCaller, Unanswered, call_within

pytestmark = pytest.mark.unit


def _fail() -> int:
    raise KeyError("the call's own error")


@pytest.mark.parametrize("kind", ["thread per call", "one thread"])
def test_a_value_or_the_calls_own_error_comes_back(kind: str) -> None:
    caller = BoundedCaller("t")
    run = (
        (lambda f: call_within(f, 5, "t"))
        if kind == "thread per call"
        else (lambda f: caller(f, 5))
    )
    assert run(lambda: 7) == 7
    with pytest.raises(KeyError, match="own error"):
        run(_fail)
    assert run(lambda: 8) == 8  # the thread serves on after an error


def test_a_call_past_its_deadline_keeps_its_thread_and_the_next_call_gets_another() -> None:
    caller, release = BoundedCaller("t"), threading.Event()
    with pytest.raises(Unanswered, match=r"no answer within 0\.2 s"):
        caller(release.wait, 0.2)
    assert caller(lambda: 8, 2) == 8  # a new thread: the first one is still held
    release.set()
    assert caller(lambda: 9, 5) == 9
