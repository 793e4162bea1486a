"""A ``Decimal`` passes the range checks of the Python API's numbers; it is kept as the float it
was checked as, so it never meets float arithmetic later (``float - Decimal`` is a TypeError: a
replay window failed every timestamped record, a retention interval every poll). Out-of-range
numbers are an :class:`OutboxkitError` (the one root) and still a ``ValueError``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from outboxkit import db
from outboxkit.errors import ConfigurationError, OutboxkitError, OutOfRangeError
from outboxkit.inbox import EventRegistry, InboxSettings, RetryPolicy
from outboxkit.inbox.delivery import InboxCore
from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.lease import LeaseSchedule
from outboxkit.inbox.retention import Purger, Retention, purge_finished
from outboxkit.inbox.steps import Poll, Sql, Step
from outboxkit.settings.models import DAY
from tests.unit.test_api_bounds import _confluent_consumer

pytestmark = pytest.mark.unit


def D(text: str) -> Any:
    """A Decimal where the annotations say float (as a config parsed with Decimals gives)."""
    return Decimal(text)


REGISTRY = EventRegistry()


def _settings(**kwargs: Any) -> InboxSettings:
    return InboxSettings(consumer="c", registry=REGISTRY, **kwargs)


def test_a_decimal_replay_window_judges_timestamps() -> None:
    settings = _settings(replay_window=D("86400"))
    now = 10 * DAY

    def env(seconds: float) -> Envelope:
        return Envelope("t", 0, 0, None, None, timestamp_ms=int(seconds * 1000))

    assert settings.too_old(env(now - 2 * DAY), now=now)
    assert not settings.too_old(env(now - 60), now=now)
    assert type(settings.replay_window) is float


def test_a_decimal_lease_schedules_its_renewals() -> None:
    settings = _settings(lease_seconds=D("30"))
    core = InboxCore(settings, lambda event, ctx, session: None, coroutines=False)
    handle = LeaseSchedule(core.statements, lambda: 100.0).begin("e", 1)
    assert handle.due == 110.0  # renewed every lease_seconds / 3


def test_a_decimal_retry_policy_backs_off() -> None:
    policy = RetryPolicy(initial_delay=D("0.5"), multiplier=D("2"), max_delay=D("30"))
    assert [policy.delay(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert policy == RetryPolicy()  # the same policy as the float defaults


def test_a_decimal_retention_interval_sets_the_next_purge() -> None:
    purger = Purger("outboxkit", Retention(D("600"), every_seconds=D("60")), 0.0, consumer="c")
    plan = purger.run_due(0.0)
    assert isinstance(next(plan), Sql)  # the first purge runs at start-up
    assert purger.next_at == 60.0
    plan.close()


class _Engine:
    @contextlib.contextmanager
    def begin(self) -> Iterator[None]:
        yield None


def test_purge_finished_pauses_a_decimal_while(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = iter([2, 0, 0])  # one full batch (a pause follows), then nothing
    seen: list[object] = []

    def execute(conn: object, query: object, params: dict[str, object]) -> int:
        seen.append(params["window_seconds"])
        return next(counts)

    monkeypatch.setattr(db, "execute", execute)
    result = purge_finished(
        _Engine(),  # type: ignore[arg-type]
        consumer="c",
        window_seconds=D("600"),
        batch_size=2,
        pause_seconds=D("0.001"),
    )
    assert (result.messages, result.rejections, result.batches) == (2, 0, 3)
    assert seen == [600.0] * 3
    assert all(type(window) is float for window in seen)  # Decimal("600") == 600.0 too


def test_decimal_consumer_options_reach_the_loop_as_floats() -> None:
    options = {"offset_commit_interval": D("1"), "poll_timeout": D("0.5"), "batch_max_ms": D("5")}
    with _confluent_consumer(**options) as consumer:
        polls: list[Poll] = []

        def execute(step: Step) -> object:
            if isinstance(step, Poll):
                polls.append(step)
                return []
            return None

        consumer.executor = execute  # type: ignore[assignment]  # a stub answers the steps
        assert consumer.poll_batch() == []
        assert consumer.poll_once(D("0.25")) is None
        assert [poll.timeout for poll in polls] == [0.5, 0.25]
        assert all(type(poll.timeout) is float for poll in polls)
        kept = consumer.loop.options
        assert (kept.offset_commit_interval, kept.poll_timeout, kept.batch_max_ms) == (1, 0.5, 5)
        assert all(type(kept_as) is float for kept_as in (kept.poll_timeout, kept.batch_max_ms))


@pytest.mark.parametrize(
    "build",
    [
        lambda: RetryPolicy(initial_delay=-1),
        lambda: RetryPolicy(max_attempts=0),
        lambda: _settings(lease_seconds=0),
        lambda: _settings(replay_window=D("-1")),
        lambda: Retention(0),
        lambda: Retention(600, every_seconds=DAY * 2),
        lambda: purge_finished(_Engine(), consumer="c", window_seconds=float("nan")),  # type: ignore[arg-type]
    ],
)
def test_an_out_of_range_argument_is_an_outboxkit_error(build: Any) -> None:
    with pytest.raises(OutboxkitError, match="must be") as caught:
        build()
    assert isinstance(caught.value, ConfigurationError)


def test_the_range_error_is_still_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"RetryPolicy\.multiplier must be") as caught:
        RetryPolicy(multiplier=0.5)
    assert isinstance(caught.value, OutOfRangeError)
