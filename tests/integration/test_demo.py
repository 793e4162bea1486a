"""The README's demo is a test too: its invariants are checked, not just printed."""

from __future__ import annotations

from outboxkit.demo import run_demo


def test_demo_end_to_end(outboxkit_db_url: str, outboxkit_kafka_bootstrap: str) -> None:
    lines: list[str] = []
    report = run_demo(outboxkit_db_url, outboxkit_kafka_bootstrap, orders=12, echo=lines.append)
    assert report.orders_committed == 12
    assert report.consumer_outcomes == {"succeeded": 12}
    assert report.consumer_duplicates_skipped == 1
    assert report.ledger_rows == 12
    assert report.rolled_back_events_published == 0
    assert lines[-1].startswith("OK:")
