"""What one Kafka transaction of the relay may carry, and when it must not send at all.

- A term run out before its records are handed to the producer (a relay paused past its lease
  between the claim and the send) sends nothing: an at-least-once producer has no
  transactional.id, so nothing would fence a zombie's records.
- Once the worker stops (SIGTERM), an open transaction claims no more: shutdown does not wait
  for a transaction to fill up to ``transaction_max_rows`` or ``transaction_max_ms``.
- ``transaction_max_rows`` below ``batch_size`` still bounds a transaction.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from outboxkit.errors import LeaseLostError
from outboxkit.faults import FaultPoints
from outboxkit.kafka.api import Delivery, RecordError
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.metrics import RelayMetrics
from outboxkit.relay.publisher import BatchPublisher, Outcome
from outboxkit.relay.reader import OutboxRecord, ShardStore
from outboxkit.settings import RelaySettings

pytestmark = pytest.mark.unit


class _Backlog:
    """A shard with more rows than any transaction takes: every claim comes back full. Also the
    topic gate (every record is sendable) and the producer, which writes down what it got."""

    def __init__(self, transactional: bool = False) -> None:
        self.transactional = transactional
        self.claimed_bytes = 0  # full by rows, not by bytes
        self.asked: list[int] = []  # the limit of every claim
        self.sent: list[int] = []  # the records of every send
        self.marked: list[int] = []
        self.on_send: list[Any] = []  # called at each send (a signal the test sends)
        self._next_id = 1

    def rows(self, count: int) -> list[OutboxRecord]:
        first, self._next_id = self._next_id, self._next_id + count
        return [
            OutboxRecord(n, str(uuid.uuid4()), f"i{n}", "t", "k", b"x", "a", None, *[None] * 4, 0)
            for n in range(first, first + count)
        ]

    async def claim(self, conn: object, shard: int, limit: int, in_flight: object) -> list[Any]:
        await asyncio.sleep(0)
        self.asked.append(limit)
        return self.rows(limit)

    async def mark_published(self, conn: object, term: object, ids: list[int], delete: bool) -> int:
        self.marked.extend(ids)
        return len(ids)

    async def sendable(self, term: object, conn: object, producer: object, claim: list[Any]) -> Any:
        return claim

    async def begin(self) -> None:
        return None

    async def send(self, requests: list[Any]) -> list[Delivery]:
        self.sent.append(len(requests))
        for signal in self.on_send:
            signal()
        await asyncio.sleep(0)
        return [Delivery(0, n) for n in range(len(requests))]

    async def commit(self) -> None:
        await asyncio.sleep(0)

    async def abort(self) -> None:
        return None


def _publisher(
    backlog: _Backlog, stop: asyncio.Event | None = None, **relay: Any
) -> BatchPublisher:
    publisher = BatchPublisher(
        RelaySettings(**relay),
        0,
        store=ShardStore("outboxkit"),
        checkpoints=None,
        metrics=RelayMetrics(),
        faults=FaultPoints(""),
        stop=stop,
    )
    publisher._store = backlog  # type: ignore[assignment]
    publisher._gate = backlog  # type: ignore[assignment]
    return publisher


def _term(trusted_for: float = 60.0) -> LeaseTerm:
    return LeaseTerm("g", 0, "me", 7, 15.0, time.monotonic() + trusted_for)


async def _one_transaction(publisher: BatchPublisher, backlog: _Backlog, term: LeaseTerm) -> Any:
    first = await publisher.claim(None)  # type: ignore[arg-type]
    outcome, _ = await publisher.publish(term, None, backlog, first)  # type: ignore[arg-type]
    await publisher.settle_mark()
    return outcome


@pytest.mark.parametrize("transactional", [False, True])
async def test_a_term_run_out_before_the_send_sends_nothing(transactional: bool) -> None:
    backlog = _Backlog(transactional)
    publisher = _publisher(backlog, batch_size=10, max_batch_size=10)
    first = await publisher.claim(None)  # type: ignore[arg-type]
    paused = _term(trusted_for=-1.0)  # its trust deadline passed while the process was stopped
    with pytest.raises(LeaseLostError, match="trust deadline"):
        await publisher.publish(paused, None, backlog, first)  # type: ignore[arg-type]
    assert backlog.sent == []
    assert backlog.marked == []


async def test_a_stopping_worker_ends_the_open_transaction_at_once() -> None:
    """SIGTERM during the first send: the claim already running goes into the transaction,
    nothing after it; without the stop the same transaction carries 100 rows."""
    settings = {
        "batch_size": 10,
        "max_batch_size": 10,
        "transaction_max_rows": 100,
        "transaction_max_ms": 60_000,  # time never ends this transaction
    }
    backlog = _Backlog()
    assert await _one_transaction(_publisher(backlog, **settings), backlog, _term()) is (
        Outcome.PUBLISHED
    )
    assert sum(backlog.sent) == 100

    stop = asyncio.Event()
    backlog = _Backlog()
    backlog.on_send.append(stop.set)
    publisher = _publisher(backlog, stop, **settings)
    await _one_transaction(publisher, backlog, _term())
    assert backlog.sent == [10, 10]
    assert publisher.stats.rows == 20


async def test_a_transaction_never_carries_more_than_transaction_max_rows() -> None:
    backlog = _Backlog()
    publisher = _publisher(backlog, batch_size=500, max_batch_size=2000, transaction_max_rows=100)
    assert publisher.limit == 100
    for _ in range(3):
        await _one_transaction(publisher, backlog, _term())
    assert max(backlog.asked) == 100
    assert publisher.stats.rows == 300
    assert publisher.stats.transactions == 3

    # A permanent error in a transaction of several claims: its rows are retried one claim per
    # transaction, each claim still within the cap.
    bad = backlog.rows(1)[0]
    error = RecordError("MSG_SIZE_TOO_LARGE", "too large")
    await publisher._handle_failures(
        _term(),
        None,
        backlog,
        list(range(250)),
        [(bad, error)],
        3,  # type: ignore[arg-type]
    )
    assert publisher.limit == 100
    assert publisher._one_claim_transactions == 3
