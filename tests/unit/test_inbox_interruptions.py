"""How interrupted runs are counted: free up to ``FREE_INTERRUPTIONS`` in a row per event, then
counted until the event's run ends another way; memory bounded."""

from __future__ import annotations

import pytest

from outboxkit.inbox import batch_claims
from outboxkit.inbox.batch_claims import FREE_INTERRUPTIONS, Interruptions

pytestmark = pytest.mark.unit


def test_interruptions_are_free_in_a_row_then_counted_until_the_run_ends_otherwise() -> None:
    seen = Interruptions()
    free = [seen.free("e1") for _ in range(FREE_INTERRUPTIONS + 2)]
    assert free == [(n <= FREE_INTERRUPTIONS, n) for n in range(1, FREE_INTERRUPTIONS + 3)]
    assert seen.free("e2") == (True, 1)  # counted per event
    seen.ended("e1")
    assert seen.free("e1") == (True, 1)


def test_interruptions_keep_a_bounded_number_of_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_claims, "OWED_MAX", 3)
    seen = Interruptions()
    for event_id in ("a", "b", "c", "d"):
        seen.free(event_id)
    assert list(seen.counts) == ["b", "c", "d"]
    seen.free("b")  # the most recent moves to the end, the oldest goes first
    seen.free("e")
    assert list(seen.counts) == ["d", "b", "e"]


def test_a_failed_claim_starts_every_count_over() -> None:
    """A claim that fails is the database's trouble (a restart loop interrupting runs between
    restarts): no event is charged for the runs it interrupted before."""
    seen = Interruptions()
    for _ in range(FREE_INTERRUPTIONS):
        seen.free("e1")
    seen.outage()
    assert seen.free("e1") == (True, 1)
