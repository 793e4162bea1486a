"""Acknowledgements are at least once: a delivery that finds its event finished acknowledges the
outcome as recorded (the delivery that finished it may have died before acknowledging it), and
an acknowledgement whose publish failed holds its record (its offset is not committed) until a
redelivery acknowledges it, or, after a bounded number of failures, is given up with an error.

The plans run against :class:`Stack`, a scripted executor keeping the inbox rows as a database
would, under both drivers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from outboxkit.db import Result
from outboxkit.errors import PermanentPublishError, PublishError
from outboxkit.inbox import Envelope, OutcomeKind
from outboxkit.inbox.acks import ack_record
from outboxkit.inbox.batch import deliver_batch
from outboxkit.inbox.gate import Gone, end_gone
from outboxkit.inbox.lease import LeaseHandle
from outboxkit.inbox.loop import ConsumerLoop
from outboxkit.inbox.loop_options import BATCH_MAX_MS, ERROR_RETRY_SECONDS, LoopOptions
from outboxkit.inbox.steps import (
    Commit,
    HandlerSql,
    Plan,
    Poll,
    Publish,
    RunInTransaction,
    Seek,
    Sql,
    StartLease,
    StartLeases,
    Step,
    Subscribe,
    TopicExists,
    drive_async,
    drive_sync,
)
from outboxkit.kafka.api import ConsumedRecord
from tests.unit.test_inbox_core import _core

pytestmark = pytest.mark.unit

ACKS = "billing.acks"
P0, P1 = ("orders", 0), ("orders", 1)


@dataclass
class Row:
    state: str
    attempts: int = 1
    error: str | None = None
    duplicates: int = 0


@dataclass
class Stack:
    """Answers every step: the inbox rows kept as the statements would, Kafka scripted."""

    rows: dict[str, Row] = field(default_factory=dict)
    polls: list[list[ConsumedRecord]] = field(default_factory=list)
    publish_errors: list[Exception] = field(default_factory=list)  # raised by the next publishes
    failing: set[str] = field(default_factory=set)  # event ids whose handler raises
    steps: list[Step] = field(default_factory=list)

    def __call__(self, step: Step) -> Any:
        self.steps.append(step)
        if isinstance(step, Subscribe):
            step.on_assign([P0, P1])
        elif isinstance(step, Poll):
            if step.timeout <= BATCH_MAX_MS / 1000:
                return []  # a batch topping itself up: nothing more arrived
            return self.polls.pop(0) if self.polls else []
        elif isinstance(step, TopicExists | Seek):
            return True
        elif isinstance(step, Publish):
            if self.publish_errors:
                raise self.publish_errors.pop(0)
        elif isinstance(step, RunInTransaction) and step.args[1].event_id in self.failing:
            raise RuntimeError("handler failed")
        elif isinstance(step, StartLease):
            return LeaseHandle(step.event_id, step.token, 0.0)
        elif isinstance(step, StartLeases):
            return [LeaseHandle(event_id, token, 0.0) for event_id, token in step.claims]
        elif isinstance(step, Sql | HandlerSql):
            return self._sql(step.query.name, step.params)
        return None

    def release(self, in_flight: Step | None) -> None:
        """The drivers' release of an interrupted plan: nothing held here."""

    def _claim(self, event_id: str) -> tuple[int, int, str | None] | None:
        row = self.rows.get(event_id)
        if row is None:
            row = self.rows[event_id] = Row("processing")
        elif row.state == "processing":
            row.attempts += 1
        else:
            return None
        return 7, row.attempts, row.error

    def _sql(self, name: str, params: Mapping[str, Any]) -> Result:
        event_id = params.get("event_id")
        if name == "claim":
            claimed = self._claim(str(event_id))
            return Result([claimed] if claimed else [], 1 if claimed else 0)
        if name == "claim_batch":
            rows = [(e, *c) for e in params["event_ids"] if (c := self._claim(e)) is not None]
            return Result(rows, len(rows))
        if name == "get_state":
            row = self.rows.get(str(event_id))
            return Result([(row.state, None, row.attempts, row.error)] if row else [], 1)
        if name == "abandon_gone":
            row = self.rows[str(event_id)]
            row.state = "dead"
            return Result([(row.attempts,)], 1)
        if name == "count_duplicate":
            self.rows[str(event_id)].duplicates += 1
        if name == "mark_succeeded":
            self.rows[str(event_id)].state = "succeeded"
        if name == "mark_succeeded_batch":
            for marked in params["event_ids"]:
                self.rows[marked].state = "succeeded"
            return Result([(e,) for e in params["event_ids"]], len(params["event_ids"]))
        return Result([], 1)

    def names(self) -> list[str]:
        return [type(s).__name__ for s in self.steps]

    def acks(self) -> list[dict[str, Any]]:
        return [json.loads(s.value or b"") for s in self.steps if isinstance(s, Publish)]

    def commits(self) -> list[dict[tuple[str, int], int]]:
        return [dict(s.offsets) for s in self.steps if isinstance(s, Commit)]

    def handler_runs(self) -> int:
        return sum(type(s).__name__ in ("CallHandler", "RunInTransaction") for s in self.steps)


def _record(offset: int, event_id: str, partition: int = 0) -> ConsumedRecord:
    headers = (("event-id", event_id.encode()), ("event-type", b"order.cancelled"))
    return ConsumedRecord("orders", partition, offset, b"k", b'{"order_id": "o1"}', headers, None)


def _drive(driver: str) -> Callable[[Plan[Any], Stack], Any]:
    def drive(plan: Plan[Any], stack: Stack) -> Any:
        if driver == "sync":
            return drive_sync(plan, stack)
        return asyncio.run(drive_async(plan, stack))

    return drive


DRIVERS = pytest.mark.parametrize("driver", ["sync", "async"])
MODES = pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "batch"])

# -- 1. a duplicate acknowledges the event's recorded outcome -----------------------------------
RECORDED = [
    ("succeeded", 1, "TimeoutError: an earlier attempt", None),  # as its first ack: no error
    ("dead", 3, "attempts exhausted; last error: boom", "attempts exhausted; last error: boom"),
    ("rejected", 1, "no handler for 'x'", "no handler for 'x'"),
    ("cancelled", 2, "operator: refund issued", "operator: refund issued"),
]


@DRIVERS
@pytest.mark.parametrize(("state", "attempts", "last_error", "acked_error"), RECORDED)
def test_a_duplicate_carries_the_events_recorded_outcome(
    driver: str, state: str, attempts: int, last_error: str, acked_error: str | None
) -> None:
    """One by one and in a batch (whose claim does not return it: asked one by one): the
    statement that reads the existing state reads the row's attempts and last error too."""
    env = Envelope.from_record(_record(5, "e1"))
    for batched in (False, True):
        stack = Stack(rows={"e1": Row(state, attempts, last_error)})
        core = _core()
        if batched:
            result = _drive(driver)(
                deliver_batch(core, [env], lambda tp: False, lambda *a: None), stack
            )
            [(_, outcome)] = result.outcomes
        else:
            outcome = _drive(driver)(core.deliver(env), stack)
        assert outcome.kind is OutcomeKind.DUPLICATE
        assert outcome.recorded == (state, attempts, last_error)
        assert stack.rows["e1"].duplicates == 1
        record = ack_record("billing", env, outcome)
        assert record is not None
        body = json.loads(record[1])
        assert {k: body[k] for k in ("event_id", "state", "attempts", "error", "offset")} == {
            "event_id": "e1",
            "state": state,
            "attempts": attempts,
            "error": acked_error,
            "offset": 5,
        }
        assert "rejection_log" not in body


@DRIVERS
@MODES
def test_a_redelivery_of_an_event_finished_before_its_acknowledgement_acknowledges_it(
    driver: str, batched: bool
) -> None:
    """The crash window: the handler's transaction committed, the process died before the
    acknowledgement (the row is succeeded, the offset not committed). The redelivery, a
    duplicate, publishes the acknowledgement a producer waits for, then commits the offset."""
    options = LoopOptions(topics=["orders"], acks_topic=ACKS, batch_max_records=5 if batched else 1)
    loop = ConsumerLoop(_core(), options, clock=lambda: 1000.0)
    stack = Stack(rows={"e1": Row("succeeded")}, polls=[[_record(5, "e1")]])
    _drive(driver)(loop.poll_batch(), stack)
    assert stack.handler_runs() == 0
    [body] = stack.acks()
    assert (body["event_id"], body["state"], body["attempts"], body["offset"]) == (
        "e1",
        "succeeded",
        1,
        5,
    )
    assert stack.commits() == [{P0: 6}]


@MODES
def test_without_an_acks_topic_a_duplicate_publishes_nothing(batched: bool) -> None:
    options = LoopOptions(topics=["orders"], batch_max_records=5 if batched else 1)
    loop = ConsumerLoop(_core(), options, clock=lambda: 1000.0)
    stack = Stack(rows={"e1": Row("succeeded")}, polls=[[_record(5, "e1")]])
    drive_sync(loop.poll_batch(), stack)
    assert "Publish" not in stack.names()
    assert stack.commits() == [{P0: 6}]


# -- 2. a failed acknowledgement holds its record, a bounded number of times ---------------------
def _loop(batched: bool, bound: int = 3) -> tuple[ConsumerLoop, list[float]]:
    now = [1000.0]
    options = LoopOptions(
        topics=["orders"],
        acks_topic=ACKS,
        batch_max_records=5 if batched else 1,
        max_unexpected_errors=bound,
    )
    return ConsumerLoop(_core(), options, clock=lambda: now[0]), now


@DRIVERS
@MODES
def test_a_failed_acknowledgement_holds_the_record_and_its_redelivery_acknowledges_it(
    driver: str, batched: bool
) -> None:
    loop, now = _loop(batched)
    stack = Stack(polls=[[_record(5, "e1")], [_record(5, "e1")]])
    stack.publish_errors.append(PublishError("publish to 'billing.acks' failed: broker away"))
    drive = _drive(driver)
    drive(loop.poll_batch(), stack)
    assert stack.rows["e1"].state == "succeeded"  # the outcome is committed ...
    assert stack.commits() == []  # ... but not the offset: the record is held
    assert [(type(s).__name__, getattr(s, "offset", None)) for s in stack.steps[-3:]] == [
        ("Publish", None),
        ("Seek", 5),
        ("Pause", None),
    ]
    assert P0 in loop.gate.held
    now[0] += ERROR_RETRY_SECONDS
    drive(loop.poll_batch(), stack)
    assert stack.handler_runs() == 1  # the redelivery is a duplicate: acknowledged, not run
    assert stack.rows["e1"].duplicates == 1
    first, again = stack.acks()
    assert first == again  # the same acknowledgement: state, attempts, error, offset
    assert (again["state"], again["attempts"], again["error"]) == ("succeeded", 1, None)
    assert stack.commits() == [{P0: 6}]


@DRIVERS
@MODES
def test_an_acknowledgement_that_keeps_failing_is_given_up_after_the_bound(
    driver: str, batched: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """No record may hold its partition for ever: after ``max_unexpected_errors`` failed
    publishes for the same record the acknowledgement is given up, with an error saying the
    outcome is in the database, and the offset moves on."""
    loop, now = _loop(batched, bound=3)
    stack = Stack(polls=[[_record(5, "e1")]] * 3 + [[_record(6, "e2")]])
    stack.publish_errors.extend(PublishError("broker away") for _ in range(3))
    drive = _drive(driver)
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        for _ in range(3):
            drive(loop.poll_batch(), stack)
            now[0] += ERROR_RETRY_SECONDS
        assert stack.commits() == [{P0: 6}]
        drive(loop.poll_batch(), stack)  # the next record runs and is acknowledged
    assert stack.commits() == [{P0: 6}, {P0: 7}]
    assert [b["event_id"] for b in stack.acks()] == ["e1", "e1", "e1", "e2"]
    assert stack.handler_runs() == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [
        "acknowledgement for e1 (orders/0 at offset 5) given up after 3 failed publish(es):"
        " broker away; its outcome is in the database: outboxkit inbox show --consumer c"
        " --event-id e1"
    ]
    assert loop.acks is not None
    assert loop.acks.failures == {}  # nothing left counted


@DRIVERS
def test_an_acknowledgement_no_retry_can_fix_is_given_up_at_once(driver: str) -> None:
    """A missing acks topic or a missing ACL: holding the record would only delay every record
    by the bound; the acknowledgement is given up at once."""
    loop, _ = _loop(batched=False)
    stack = Stack(polls=[[_record(5, "e1")]])
    stack.publish_errors.append(PermanentPublishError("publish failed: UNKNOWN_TOPIC_OR_PART"))
    _drive(driver)(loop.poll_batch(), stack)
    assert stack.names().count("Publish") == 1
    assert stack.commits() == [{P0: 6}]
    assert P0 not in loop.gate.held


def test_in_a_batch_the_records_behind_a_failed_acknowledgement_wait_with_it() -> None:
    """Offset 6 is not committed past the held 5 (nor acknowledged yet): it comes again after
    the seek back, a duplicate, and is acknowledged then. Another partition's record is held
    too, its publish not tried (each try may wait out the sender's timeout, with no poll in
    between: a batch of them would outlast max.poll.interval.ms), and comes again with it."""
    loop, now = _loop(batched=True)
    first = [_record(5, "e1"), _record(6, "e2"), _record(0, "e3", partition=1)]
    stack = Stack(polls=[first, list(first)])
    stack.publish_errors.append(PublishError("broker away"))
    drive_sync(loop.poll_batch(), stack)
    assert {e: r.state for e, r in stack.rows.items()} == dict.fromkeys(
        ["e1", "e2", "e3"], "succeeded"
    )
    assert [b["event_id"] for b in stack.acks()] == ["e1"]  # failed: e3's not tried
    assert stack.commits() == []
    now[0] += ERROR_RETRY_SECONDS
    drive_sync(loop.poll_batch(), stack)
    assert [b["event_id"] for b in stack.acks()] == ["e1", "e1", "e2", "e3"]
    assert stack.commits() == [{P0: 6}, {P0: 7}, {P1: 1}]
    assert stack.handler_runs() == 3


def test_a_retry_behind_a_failed_acknowledgement_leaves_the_hold_on_it() -> None:
    """e2's handler fails (a retry at 6) behind e1, whose acknowledgement failed: the partition
    stays held at 5, not 6, or e1 would never be delivered (nor acknowledged) again."""
    loop, now = _loop(batched=True)
    stack = Stack(polls=[[_record(5, "e1"), _record(6, "e2")]], failing={"e2"})
    stack.publish_errors.append(PublishError("broker away"))
    drive_sync(loop.poll_batch(), stack)
    assert stack.rows["e2"].state == "processing"  # its failure recorded: retried later
    assert [s.offset for s in stack.steps if isinstance(s, Seek)] == [5]
    now[0] += ERROR_RETRY_SECONDS
    stack.failing.clear()
    stack.polls.append([_record(5, "e1"), _record(6, "e2")])
    drive_sync(loop.poll_batch(), stack)  # e1 (a duplicate now) is acknowledged
    drive_sync(loop.poll_batch(), stack)  # e2, a takeover, runs alone
    assert [s.offset for s in stack.steps if isinstance(s, Seek)] == [5, 5]
    assert [b["event_id"] for b in stack.acks()] == ["e1", "e1", "e2"]
    assert stack.commits() == [{P0: 6}, {P0: 7}]


def test_with_interval_commits_the_held_record_is_not_committed_either() -> None:
    """Settled offsets wait for the interval: the one of a held record is never among them."""
    now = [1000.0]
    options = LoopOptions(
        topics=["orders"], acks_topic=ACKS, batch_max_records=1, offset_commit_interval=5.0
    )
    loop = ConsumerLoop(_core(), options, clock=lambda: now[0])
    stack = Stack(polls=[[_record(4, "e0")], [_record(5, "e1")]])
    drive_sync(loop.poll_batch(), stack)  # e0 acknowledged: 5 pending
    stack.publish_errors.append(PublishError("broker away"))
    drive_sync(loop.poll_batch(), stack)  # e1 not: held at 5
    now[0] += 10
    drive_sync(loop.close(), stack)
    assert stack.commits() == [{P0: 5}]


@DRIVERS
def test_a_gone_records_acknowledgement_is_tried_again_at_once(
    driver: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A held record that left the log is never delivered again: its acknowledgement (``dead``)
    cannot wait for a redelivery, so a failed publish is tried again in place."""
    stack = Stack(rows={"e1": Row("processing", 2)})
    stack.publish_errors.append(PublishError("broker away"))
    plan = end_gone([Gone(P0, 5, "e1")], _core().statements, ACKS)
    with caplog.at_level("WARNING", logger="outboxkit.inbox.consumer"):
        _drive(driver)(plan, stack)
    assert stack.rows["e1"].state == "dead"
    first, again = stack.acks()
    assert first == again
    assert (again["event_id"], again["state"], again["attempts"], again["offset"]) == (
        "e1",
        "dead",
        2,
        5,
    )
    assert [r.levelname for r in caplog.records] == ["WARNING"]
