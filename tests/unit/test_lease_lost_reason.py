"""The reason a failed token check gives, from the lease row (pure logic)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from outboxkit.relay.lease import LeaseLoss, LeaseTerm, why_check_failed

NOW = datetime(2026, 12, 4, 0, 41, 29, tzinfo=UTC)


def _term(trusted_for: float) -> LeaseTerm:
    return LeaseTerm(
        "g", 0, "A", 7, 15.0, 100.0 + trusted_for, clock=lambda: 100.0, wall=lambda: 0.0
    )


@pytest.mark.parametrize(
    ("row", "trusted_for", "cause", "reason"),
    [
        (None, 5.0, LeaseLoss.UNKNOWN, "the lease row is gone"),
        (
            (8, "B", NOW + timedelta(seconds=9), NOW),
            5.0,
            LeaseLoss.TAKEN_OVER,
            "taken over (token 8 now, held by B)",
        ),
        (
            (9, None, NOW, NOW),
            5.0,
            LeaseLoss.TAKEN_OVER,
            "taken over (token 9 now, since released)",
        ),
        ((7, None, NOW, NOW), 5.0, LeaseLoss.RELEASED, "released"),
        (
            (7, "A", NOW - timedelta(seconds=1.5), NOW),
            6.2,
            LeaseLoss.CLOCK_JUMP,
            "expired by the database clock 1.5s ago while this process still trusted it for"
            " 6.2s (the clocks disagree: this host was paused, or the database host's clock"
            " jumped or was stepped)",
        ),
        (
            (7, "A", NOW - timedelta(seconds=2), NOW),
            -1.0,
            LeaseLoss.EXPIRED,
            "expired by the database clock 2.0s ago (renewals did not succeed)",
        ),
        (
            (7, "A", NOW + timedelta(seconds=3), NOW),
            5.0,
            LeaseLoss.UNKNOWN,
            "the token check failed, but the lease row is ours and unexpired now",
        ),
    ],
)
def test_the_reason_names_what_the_lease_row_shows(
    row: tuple[object, ...] | None, trusted_for: float, cause: LeaseLoss, reason: str
) -> None:
    assert why_check_failed(_term(trusted_for), row) == (cause, reason)
