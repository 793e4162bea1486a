"""The Python API's own numbers (not the pydantic settings): NaN, infinity, out-of-range values
are refused when the object is built, naming the argument and its range. Each case says what
the value would have done downstream had it been accepted."""

from __future__ import annotations

import math

import pytest

from outboxkit.bounds import check_range
from outboxkit.inbox import RetryPolicy
from outboxkit.inbox.gate import PartitionGate
from outboxkit.settings.models import DAY

pytestmark = pytest.mark.unit

NAN, INF = math.nan, math.inf


def test_check_range_refuses_nan_inf_and_wrong_types_without_echoing_text() -> None:
    check_range("x", 0.0, 0, 1)
    check_range("x", 10**400, 1, integer=True)  # a huge int is finite
    for value in (NAN, INF, -INF, -1, 2, True, "secret-text"):
        with pytest.raises(ValueError, match="x must be a finite number between 0 and 1") as e:
            check_range("x", value, 0, 1)
        assert "secret-text" not in str(e.value)
    with pytest.raises(ValueError, match=r"an integer above 0, not 2\.5"):
        check_range("x", 2.5, 0, above=True, integer=True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("initial_delay", NAN),  # delay() NaN: the retry is never due, the partition stays paused
        ("initial_delay", INF),
        ("initial_delay", DAY + 1),
        ("max_delay", NAN),  # min(x, nan) is x: an unbounded delay
        ("max_delay", INF),
        ("max_delay", DAY * 7),
        ("initial_delay", -1.0),
        ("multiplier", NAN),
        ("multiplier", INF),  # inf * 0 attempts: NaN
        ("multiplier", 0.5),
        ("max_attempts", NAN),  # never exhausted: a poison event retried forever
        ("max_attempts", INF),
        ("max_attempts", 0),
        ("max_attempts", 2.5),
    ],
)
def test_retry_policy_refuses_non_finite_and_out_of_range(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"RetryPolicy\.{field} must be"):
        RetryPolicy(**{field: value})  # type: ignore[arg-type]


def test_a_nan_delay_would_have_paused_the_partition_for_good() -> None:
    gate = PartitionGate()
    gate.hold(("t", 0), 5, due=100.0 + NAN)
    assert gate.due(1e18) == []  # what RetryPolicy(initial_delay=nan) led to: now refused


def test_retry_delay_does_not_overflow_after_many_attempts() -> None:
    policy = RetryPolicy(max_attempts=5000, initial_delay=1.0, multiplier=2, max_delay=DAY)
    assert policy.delay(1) == 1.0
    assert policy.delay(2000) == DAY  # 2.0 ** 1999 raises OverflowError
    assert RetryPolicy(max_attempts=5000, multiplier=10).delay(5000) == 30.0
