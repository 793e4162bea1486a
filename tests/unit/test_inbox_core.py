"""The inbox's sans-IO core driven by scripted executors: decisions without a database or Kafka.

The same plans run under ``drive_sync`` and ``drive_async`` in production; here a table of
replies stands in for the database and the client seam.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from outboxkit.db import Result
from outboxkit.inbox import Envelope, EventRegistry, InboxSettings, OutcomeKind
from outboxkit.inbox import loop as loop_module
from outboxkit.inbox.batch import BatchResult
from outboxkit.inbox.delivery import InboxCore
from outboxkit.inbox.gate import SEEK_RETRY_SECONDS
from outboxkit.inbox.lease import REFUSED, LeaseHandle, LeaseSchedule
from outboxkit.inbox.loop import ConsumerLoop
from outboxkit.inbox.loop_options import LoopOptions
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.policy import RetryPolicy
from outboxkit.inbox.steps import (
    CallHandler,
    CloseConsumer,
    CloseSender,
    Commit,
    HandlerSql,
    Pause,
    Plan,
    Poll,
    Publish,
    Seek,
    Sleep,
    Sql,
    StartLease,
    Step,
    Subscribe,
    drive_async,
    drive_sync,
)
from outboxkit.inbox.store import InboxStatements
from outboxkit.kafka.api import ConsumedRecord
from tests.unit.test_inbox_logic import Cancelled

pytestmark = pytest.mark.unit

NONE = Result([], 0)
ONE = Result([], 1)


class Script:
    """An executor answering each step from a function, recording what it was asked."""

    def __init__(self, answer: Callable[[Step], Any]) -> None:
        self.answer = answer
        self.steps: list[Step] = []
        self.released = 0
        self.in_flight: list[Step | None] = []  # told at each release

    def __call__(self, step: Step) -> Any:
        self.steps.append(step)
        return self.answer(step)

    def release(self, in_flight: Step | None) -> None:
        self.released += 1
        self.in_flight.append(in_flight)

    def names(self) -> list[str]:
        return [_name(s) for s in self.steps]


def _name(step: Step) -> str:
    return step.query.name if isinstance(step, Sql | HandlerSql) else type(step).__name__


def _plan() -> Plan[str]:
    first = yield Sleep(1)
    try:
        yield Sleep(2)
    except ValueError as exc:
        return f"{first}/{exc}"
    return "no error"


def _answer(step: Step) -> Any:
    if isinstance(step, Sleep) and step.seconds == 2:
        raise ValueError("boom")
    return "one"


def test_the_same_plan_runs_under_both_drivers() -> None:
    assert drive_sync(_plan(), Script(_answer)) == "one/boom"

    async def answer(step: Step) -> Any:
        return _answer(step)

    assert asyncio.run(drive_async(_plan(), Script(answer))) == "one/boom"


def test_an_interrupted_plan_is_released() -> None:
    def interrupt(step: Step) -> Any:
        raise KeyboardInterrupt

    script = Script(interrupt)
    with pytest.raises(KeyboardInterrupt):
        drive_sync(_plan(), script)
    assert script.released == 1


def _env(offset: int = 0, event_type: str = "order.cancelled") -> Envelope:
    return Envelope.from_parts(
        topic="orders",
        partition=0,
        offset=offset,
        key=b"k",
        value=b'{"order_id": "o1"}',
        headers=[("event-id", b"e1"), ("event-type", event_type.encode())],
    )


def _core(max_attempts: int = 3) -> InboxCore:
    registry = EventRegistry()
    registry.register(Cancelled)
    settings = InboxSettings(
        consumer="c", registry=registry, policy=RetryPolicy(max_attempts=max_attempts)
    )
    return InboxCore(settings, lambda e, c, s: None, coroutines=False)


def _db(
    claim: tuple[int, int, str | None] | None,
    state: str | None = None,
    handler_fails: bool = True,
    refused: str = "",
) -> Callable[..., Any]:
    def answer(step: Step) -> Any:
        if isinstance(step, CallHandler) and handler_fails:
            raise RuntimeError("handler failed")
        if isinstance(step, StartLease):
            return LeaseHandle(step.event_id, step.token, 0.0)
        name = _name(step)
        if name == "claim":
            return Result([claim], 1) if claim else NONE
        if name == "get_state":
            return Result([(state, None, 1, None)], 1) if state else NONE
        return NONE if name == refused else ONE

    return answer


def test_a_failed_handler_is_recorded_for_retry_with_backoff() -> None:
    script = Script(_db((7, 1, None)))
    outcome = drive_sync(_core().deliver(_env()), script)
    assert (outcome.kind, outcome.attempts, outcome.retry_in) == (OutcomeKind.RETRY, 1, 0.5)
    assert script.names() == [
        "claim",
        "StartLease",
        "CallHandler",
        "CloseHandler",
        "record_failure",
        "EndDelivery",
    ]


def test_the_last_attempt_dead_letters_before_marking_dead() -> None:
    letters: list[tuple[str, int]] = []

    def dead_letter(env: Envelope, event_id: str, error: str, attempts: int) -> Step:
        letters.append((event_id, attempts))
        return Publish("orders.dlq", env.key, env.value, [])

    script = Script(_db((7, 3, "earlier")))
    outcome = drive_sync(_core().deliver(_env(), dead_letter=dead_letter), script)
    assert outcome.kind is OutcomeKind.DEAD
    assert letters == [("e1", 3)]
    names = script.names()
    assert names.index("renew_lease") < names.index("Publish") < names.index("finish")


def test_a_finished_event_is_a_duplicate_and_a_cancelled_lease_is_cancelled() -> None:
    script = Script(_db(None, state="succeeded"))
    assert drive_sync(_core().deliver(_env()), script).kind is OutcomeKind.DUPLICATE
    assert script.names() == ["claim", "get_state", "count_duplicate", "EndDelivery"]

    # The succeeded mark matches nothing: cancelled meanwhile. Nothing is committed.
    script = Script(_db((7, 1, None), "cancelled", handler_fails=False, refused="mark_succeeded"))
    assert drive_sync(_core().deliver(_env()), script).kind is OutcomeKind.CANCELLED
    assert "CommitHandler" not in script.names()
    assert script.names()[-4:] == [
        "CloseHandler",
        "record_lease_lost",
        "get_state",
        "EndDelivery",
    ]


def test_an_event_type_without_a_handler_is_rejected_on_its_row() -> None:
    registry = EventRegistry()
    registry.register(Cancelled)
    core = InboxCore(InboxSettings(consumer="c", registry=registry), None, coroutines=False)
    script = Script(_db((7, 1, None)))
    outcome = drive_sync(core.deliver(_env()), script)
    assert outcome.kind is OutcomeKind.REJECTED
    assert "no handler" in (outcome.error or "")
    assert script.names() == ["claim", "finish", "EndDelivery"]


def test_the_lease_schedule_renews_when_due_and_stops_once_lost() -> None:
    now = [100.0]
    schedule = LeaseSchedule(InboxStatements("c", owner="me", lease_seconds=3), lambda: now[0])
    handle = schedule.begin("e1", 7)
    answers = iter([ONE, NONE])
    steps: list[Step] = []

    def answer(step: Step) -> Any:
        steps.append(step)
        if isinstance(step, Sleep):
            now[0] += step.seconds
            return None
        return next(answers)

    stop_after = iter(range(6))
    drive_sync(schedule.keep(lambda: next(stop_after, None) is None), Script(answer))
    kinds = [s.query.name if isinstance(s, Sql) else s.seconds for s in steps]  # type: ignore[attr-defined]
    assert kinds[:4] == [1.0, "renew_lease", 1.0, "renew_lease"]
    assert handle.reason() == REFUSED
    assert all(k == 1.0 for k in kinds[4:])  # lost: never renewed again


def _record(partition: int, offset: int) -> ConsumedRecord:
    headers = (("event-id", f"e{partition}-{offset}".encode()), ("event-type", b"x"))
    return ConsumedRecord("orders", partition, offset, b"k", b"{}", headers, None)


def _loop(interval: float = 0.0) -> ConsumerLoop:
    return ConsumerLoop(
        _core(),
        LoopOptions(topics=["orders"], offset_commit_interval=interval),
        clock=lambda: 1000.0,
    )


def test_a_revoked_hold_is_forgotten_and_its_partition_taken_again_on_assignment() -> None:
    loop = _loop(interval=60.0)
    polls = iter([[_record(0, 5)], [_record(1, 3)], [_record(0, 5)]])

    def answer(step: Step) -> Any:
        if isinstance(step, Subscribe):
            step.on_assign([("orders", 0), ("orders", 1)])
            return None
        if isinstance(step, Poll):
            return next(polls)
        return ONE

    seen: list[tuple[int, int]] = []

    def deliver(env: Envelope, *args: Any) -> Plan[Outcome]:
        yield from ()
        seen.append((env.partition, env.offset))
        if seen.count((0, 5)) == 1 and env.partition == 0:
            return Outcome(OutcomeKind.RETRY, "e", retry_in=600)
        return Outcome(OutcomeKind.SUCCEEDED, "e")

    loop.core.deliver = deliver  # type: ignore[method-assign]
    script = Script(answer)
    assert drive_sync(loop.poll_once(), script).kind is OutcomeKind.RETRY  # type: ignore[union-attr]
    assert [type(s) for s in script.steps[-2:]] == [Seek, Pause]
    assert loop.gate.held == frozenset({("orders", 0)})
    assert drive_sync(loop.poll_once(), script).kind is OutcomeKind.SUCCEEDED  # type: ignore[union-attr]
    # A rebalance: both revoked (the settled offset of partition 1 is handed over for commit).
    assert loop.on_revoke([("orders", 0), ("orders", 1)]) == {("orders", 1): 4}
    assert loop.gate.held == frozenset()
    loop.on_assign([("orders", 0)])
    outcome = drive_sync(loop.poll_once(), script)
    assert outcome is not None
    assert outcome.kind is OutcomeKind.SUCCEEDED
    assert seen == [(0, 5), (1, 3), (0, 5)]  # taken again at once, not after the 600 s hold
    assert not any(isinstance(s, Commit) for s in script.steps)  # interval not elapsed


def test_a_failed_offset_commit_on_close_still_closes_both_clients() -> None:
    """A client error in the last commit (not a PublishError, which is only logged) is raised,
    but only after the consumer and the sender were closed: neither is left open."""
    loop = _loop(interval=60.0)  # the settled offset waits for the close

    def deliver(env: Envelope, *args: Any) -> Plan[Outcome]:
        yield from ()
        return Outcome(OutcomeKind.SUCCEEDED, "e")

    def answer(step: Step) -> Any:
        if isinstance(step, Subscribe):
            step.on_assign([("orders", 0)])
            return None
        if isinstance(step, Poll):
            return [_record(0, 5)]
        if isinstance(step, Commit):
            raise RuntimeError("the client is broken")
        return ONE

    loop.core.deliver = deliver  # type: ignore[method-assign]
    script = Script(answer)
    assert drive_sync(loop.poll_once(), script) is not None
    with pytest.raises(RuntimeError, match="broken"):
        drive_sync(loop.close(), script)
    assert [type(s) for s in script.steps[-3:]] == [Commit, CloseConsumer, CloseSender]


def test_records_of_a_revoked_partition_are_dropped_unprocessed() -> None:
    loop = _loop()
    loop.on_assign([("orders", 0)])
    loop.buffer.extend([_record(0, 1), _record(0, 2)])
    loop.on_revoke([("orders", 0)])
    assert not loop.buffer
    loop.buffer.append(_record(0, 3))
    loop.subscribed = True
    assert drive_sync(loop.poll_once(), Script(lambda s: ONE)) is None


# -- a retry hold whose failed record left the log (retention, compaction, delete_records) ------
class Held:
    """One consumer whose partition 0 is held for a retry of offset 5, due 10 s later; each
    Poll answers the next list of ``polls``; ``seen`` lists what was delivered."""

    def __init__(self, batch_max_records: int = 1) -> None:
        self.now = 1000.0
        options = LoopOptions(topics=["orders"], batch_max_records=batch_max_records)
        self.loop = ConsumerLoop(_core(), options, clock=lambda: self.now)
        self.loop.core.deliver = self.deliver  # type: ignore[method-assign]
        self.polls: list[list[ConsumedRecord]] = [[_record(0, 5), _record(0, 6)]]
        self.seen: list[tuple[int, bytes | None]] = []
        self.script = Script(self.answer)

    def answer(self, step: Step) -> Any:
        if isinstance(step, Subscribe):
            step.on_assign([("orders", 0)])
            return None
        if isinstance(step, Poll):
            return self.polls.pop(0) if self.polls else []
        return ONE

    def outcome(self, env: Envelope) -> Outcome:
        self.seen.append((env.offset, env.key))
        if len(self.seen) == 1:
            return Outcome(OutcomeKind.RETRY, "e", retry_in=10)
        return Outcome(OutcomeKind.SUCCEEDED, "e")

    def deliver(self, env: Envelope, *args: Any) -> Plan[Outcome]:
        yield from ()
        return self.outcome(env)

    def hold(self) -> None:
        self.loop.subscribed = False
        drive_sync(self.loop.poll_batch(), self.script)
        assert self.loop.gate.held == frozenset({("orders", 0)})
        assert not self.loop.buffer
        self.now += 10  # the retry is due

    def after_resume(self) -> list[str]:
        """The steps from the resume's seek on (the hold began with a seek to 5 too)."""
        names = self.script.names()
        return names[len(names) - 1 - names[::-1].index("Seek") :]


def _stale(offset: int) -> ConsumedRecord:
    return _record(0, offset)._replace(key=b"stale")


def test_a_resumed_hold_goes_on_at_the_first_offset_left_when_the_failed_one_is_gone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Offsets 5 and 6 were deleted while 5 was held: the seek back to 5 resumes at 7 (the
    client's offset reset). The partition goes on from there, with a warning, instead of
    dropping every record for good."""
    held = Held()
    held.hold()
    held.polls = [[_record(0, 7)], [_record(0, 8)]]
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        outcome = drive_sync(held.loop.poll_once(), held.script)
    assert outcome is not None
    assert outcome.kind is OutcomeKind.SUCCEEDED
    assert held.after_resume()[:3] == ["Seek", "Resume", "Poll"]
    assert drive_sync(held.loop.poll_once(), held.script) is not None
    assert held.seen == [(5, b"k"), (7, b"k"), (8, b"k")]
    commits = [s.offsets for s in held.script.steps if isinstance(s, Commit)]
    assert commits == [{("orders", 0): 8}, {("orders", 0): 9}]
    assert "orders/0: held record at offset 5 is gone; resuming at 7" in caplog.messages
    ended = [s for s in held.script.steps if isinstance(s, Sql) and s.query.name == "abandon_gone"]
    assert [(s.params["event_id"], s.params["kafka_offset"]) for s in ended] == [("e", 5)]
    names = held.script.names()  # after record 7 was processed, before 8 was polled
    assert names.index("abandon_gone") < len(names) - 1 - names[::-1].index("Poll")


def test_records_buffered_before_the_resume_are_not_judged_the_failed_one_comes_first() -> None:
    """Records of the held partition fetched before the seek that resumes it (a batch that
    stopped at its limit leaves some behind) would end the hold in place of offset 5, which
    would be skipped. They are dropped with the resume; the seek delivers 5, then them."""
    held = Held()
    held.hold()
    held.loop.buffer.extend([_stale(6), _stale(7)])
    held.polls = [[_record(0, 5), _record(0, 6), _record(0, 7)]]
    outcome = drive_sync(held.loop.poll_once(), held.script)  # the first call after the due
    assert outcome is not None
    assert outcome.kind is OutcomeKind.SUCCEEDED
    for _ in range(2):
        drive_sync(held.loop.poll_once(), held.script)
    assert held.seen == [(5, b"k"), (5, b"k"), (6, b"k"), (7, b"k")]


def test_a_batch_after_the_resume_takes_only_what_the_seek_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batched path (``_take``): the failed offset 5 is gone and records fetched before
    the seek are still buffered. The batch is what the seek delivered, each record once."""
    held = Held(batch_max_records=50)
    batches: list[list[tuple[int, bytes | None]]] = []

    def deliver_batch(core: Any, envs: list[Envelope], *args: Any) -> Plan[BatchResult]:
        yield from ()
        batches.append([(e.offset, e.key) for e in envs])
        return BatchResult([(e, held.outcome(e)) for e in envs], [])

    monkeypatch.setattr(loop_module, "deliver_batch", deliver_batch)
    held.polls = [[_record(0, 5)]]
    held.hold()
    held.loop.buffer.extend([_stale(6), _stale(7)])
    held.polls = [[_record(0, 6), _record(0, 7)]]
    outcomes = drive_sync(held.loop.poll_batch(), held.script)
    assert [o.kind for o in outcomes] == [OutcomeKind.SUCCEEDED] * 2
    assert batches == [[(5, b"k")], [(6, b"k"), (7, b"k")]]
    assert held.after_resume()[:3] == ["Seek", "Resume", "Poll"]


def test_a_resume_whose_seek_fails_stays_paused_and_tries_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client refused the seek back to held offset 5 (it still fetches from 7): resuming
    would deliver 7 first, and the gate would take that for offset 5 gone and skip it. The
    partition stays paused and the resume is tried again a second later."""
    held = Held()
    held.hold()
    refusals = [False]
    plain = held.answer

    def answer(step: Step) -> Any:
        if isinstance(step, Seek) and refusals:
            return refusals.pop()
        return plain(step)

    held.script.answer = answer
    held.polls = [[_record(0, 7)]]
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        assert drive_sync(held.loop.poll_once(timeout=0), held.script) is None
    assert "Resume" not in held.after_resume()
    assert held.loop.gate.held == frozenset({("orders", 0)})
    assert held.loop.gate.next_due() == held.now + SEEK_RETRY_SECONDS
    assert "orders/0: could not seek back to held offset 5; trying again in 1 s" in caplog.messages
    held.now += SEEK_RETRY_SECONDS
    held.polls = [[_record(0, 5), _record(0, 6)]]
    outcome = drive_sync(held.loop.poll_once(), held.script)
    assert outcome is not None
    assert held.after_resume()[:3] == ["Seek", "Resume", "Poll"]
    assert held.seen == [(5, b"k"), (5, b"k")]
