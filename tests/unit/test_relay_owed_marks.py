"""What an at_least_once shard owes: the rows Kafka took whose mark did not commit.

:class:`OwedMarks` alone, with a stand-in for the store's reconcile (the statement itself is
run on the real database by ``tests/integration/test_relay_marks_refused.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest

from outboxkit.kafka.api import Delivery, RecordError
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.owed_marks import OwedMarks
from outboxkit.relay.reader import OutboxRecord, ShardStore

pytestmark = pytest.mark.unit

CONN: Any = object()


def _term(token: int, previous: int | None) -> LeaseTerm:
    term = LeaseTerm("default", 0, "me", token, 30.0, 0.0)
    term.previous = previous
    return term


TERM = _term(2, None)  # a first term: nothing owed before it


class _Store:
    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.calls: list[tuple[list[tuple[int, str]], bool]] = []

    async def reconcile(
        self, conn: Any, term: LeaseTerm, carried: Sequence[tuple[int, str]], *, delete: bool
    ) -> int:
        self.calls.append((list(carried), delete))
        if self.fails:
            raise RuntimeError("the mark failed again")
        return len(carried)


def _store(store: _Store) -> ShardStore:
    return cast(ShardStore, store)


async def test_rows_are_owed_until_their_mark_commits() -> None:
    owed = OwedMarks(enabled=True)
    assert await owed.pay(_store(_Store()), CONN, TERM, delete=False) is None  # the first term
    owed.owe([(1, "a"), (2, "b")])
    owed.owe([(3, "c")])
    owed.paid([1, 2])
    store = _Store()
    assert await owed.pay(_store(store), CONN, _term(5, 2), delete=False) == 1
    assert store.calls == [([(3, "c")], False)]
    assert len(owed) == 0
    assert await owed.pay(_store(store), CONN, _term(7, 5), delete=False) is None  # no statement
    assert len(store.calls) == 1


async def test_a_payment_that_fails_owes_the_rows_still() -> None:
    owed = OwedMarks(enabled=True)
    await owed.pay(_store(_Store()), CONN, TERM, delete=True)
    owed.owe([(7, "g"), (8, "h")])
    failing = _Store(fails=True)
    with pytest.raises(RuntimeError):
        await owed.pay(_store(failing), CONN, _term(3, 2), delete=True)
    assert len(owed) == 2
    store = _Store()
    assert await owed.pay(_store(store), CONN, _term(4, 3), delete=True) == 2
    assert store.calls == [([(7, "g"), (8, "h")], True)]  # by (id, event id), in sent order


def test_exactly_once_owes_nothing() -> None:
    """There a takeover reconciles from the checkpoint topic."""
    owed = OwedMarks(enabled=False)
    owed.owe([(1, "a")])
    assert len(owed) == 0


def _record(row_id: int) -> OutboxRecord:
    return OutboxRecord(
        row_id, f"e{row_id}", "k", "t", None, b"", "json", None, None, None, None, None, 0
    )


async def _failed_mark() -> None:
    raise RuntimeError("the previous batch's mark failed")


async def _mark_done() -> None:
    return None


async def test_records_sent_while_the_previous_mark_failed_are_owed_too() -> None:
    owed = OwedMarks(enabled=True)
    await owed.pay(_store(_Store()), CONN, TERM, delete=False)
    sent = [_record(4), _record(5)]
    with pytest.raises(RuntimeError):
        await owed.awaiting(_failed_mark(), sent, [Delivery(0, 1), Delivery(0, 2)])
    store = _Store()
    await owed.pay(_store(store), CONN, _term(3, 2), delete=False)
    assert store.calls == [([(4, "e4"), (5, "e5")], False)]


async def test_records_kafka_did_not_all_take_are_not_owed() -> None:
    """They are sent again (a failed delivery), or were never sent (the send raised)."""
    owed = OwedMarks(enabled=True)
    refused = Delivery(error=RecordError("REQUEST_TIMED_OUT", "no answer"))
    with pytest.raises(RuntimeError):
        await owed.awaiting(_failed_mark(), [_record(4), _record(5)], [Delivery(0, 1), refused])
    with pytest.raises(RuntimeError):
        await owed.awaiting(_failed_mark(), [_record(6)], [])
    assert len(owed) == 0


async def test_a_previous_mark_that_worked_owes_nothing() -> None:
    owed = OwedMarks(enabled=True)
    await owed.awaiting(_mark_done(), [_record(4)], [Delivery(0, 1)])
    assert len(owed) == 0


async def test_another_holder_since_drops_what_was_owed() -> None:
    """It claimed the rows meanwhile and may have sent some again: marking them now could leave
    an older record of a key last. They go with the claims instead."""
    owed = OwedMarks(enabled=True)
    await owed.pay(_store(_Store()), CONN, TERM, delete=False)
    owed.owe([(1, "a")])
    store = _Store()
    assert await owed.pay(_store(store), CONN, _term(9, 4), delete=False) is None  # 4: another's
    assert store.calls == []
    assert len(owed) == 0
