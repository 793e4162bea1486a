"""The adaptive claim size: small when drained, growing under backlog, bounded by bytes."""

from __future__ import annotations

import uuid

from outboxkit.relay.claim_size import ClaimSizer
from outboxkit.relay.reader import OutboxRecord


def _rows(count: int, size: int = 10) -> list[OutboxRecord]:
    return [
        OutboxRecord(
            n, str(uuid.uuid4()), f"i{n}", "t", "k", b"x" * size, "a", None, *[None] * 4, 0
        )
        for n in range(count)
    ]


def _observe(sizer: ClaimSizer, asked: int, rows: list[OutboxRecord]) -> None:
    """As the claim counts bytes: these rows carry no key bytes of note, no headers."""
    sizer.observe(asked, len(rows), sum(len(r.payload) for r in rows))


def test_full_claims_double_the_size_up_to_the_throughput_setting() -> None:
    sizer = ClaimSizer(100, 500, 1 << 20)
    sizes = []
    for _ in range(5):
        asked = sizer.size
        _observe(sizer, asked, _rows(asked))
        sizes.append(sizer.size)
        assert sizer.full
    assert sizes == [200, 400, 500, 500, 500]


def test_a_short_claim_falls_back_to_the_latency_setting_at_once() -> None:
    sizer = ClaimSizer(100, 800, 1 << 20)
    _observe(sizer, 100, _rows(100))
    _observe(sizer, 200, _rows(200))
    assert sizer.size == 400
    _observe(sizer, 400, _rows(399))
    assert (sizer.size, sizer.full) == (100, False)
    _observe(sizer, 100, [])  # idle
    assert (sizer.size, sizer.full) == (100, False)


def test_a_claim_cut_by_the_byte_cap_counts_as_full_and_a_small_one_does_not() -> None:
    sizer = ClaimSizer(100, 800, 1024)
    _observe(sizer, 100, _rows(2, 600))  # 1,200 bytes: the cap stopped it, there is more
    assert (sizer.full, sizer.size) == (True, 200)
    _observe(sizer, 200, _rows(3, 10))
    assert (sizer.full, sizer.size) == (False, 100)


def test_a_throughput_setting_below_the_latency_one_means_a_fixed_size() -> None:
    sizer = ClaimSizer(500, 100, 1 << 20)
    _observe(sizer, 500, _rows(500))
    assert sizer.size == 500


def test_isolation_claims_of_one_row_count_as_full() -> None:
    sizer = ClaimSizer(100, 800, 1 << 20)
    _observe(sizer, 100, _rows(100))
    _observe(sizer, 1, _rows(1))  # isolating a bad row: one row asked, one row back (full)
    assert (sizer.full, sizer.size) == (True, 400)


def test_a_transaction_is_filled_to_its_row_cap_but_not_by_a_tiny_remainder() -> None:
    sizer = ClaimSizer(100, 800, 1 << 20)
    sizer.size = 800
    assert sizer.next_in_transaction(0, 5000) == 800
    assert sizer.next_in_transaction(4700, 5000) == 300
    assert sizer.next_in_transaction(4950, 5000) == 0  # 50 left: below batch_size, commit
    assert sizer.next_in_transaction(5000, 5000) == 0


def test_reset_returns_to_the_latency_setting() -> None:
    sizer = ClaimSizer(100, 800, 1 << 20)
    _observe(sizer, 100, _rows(100))
    _observe(sizer, 200, _rows(200))
    sizer.reset()  # a permanent error: what is retried (maybe row by row) stays small
    assert sizer.size == 100
