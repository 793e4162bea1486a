"""Batch handlers without a database or Kafka: the registry API, the grouping that keeps
partition order, and the batch plan's bulk call and its one-by-one fallback, driven by a
scripted executor that keeps the transaction's writes (so a lost or doubled effect shows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic
import pytest

from outboxkit.db import Result
from outboxkit.errors import ConfigurationError, LeaseLostError
from outboxkit.events import Event
from outboxkit.inbox import BatchContext, Envelope, EventRegistry, InboxSettings, OutcomeKind
from outboxkit.inbox.batch import BatchResult, deliver_batch
from outboxkit.inbox.batch_handler import OneAtATime, rounds
from outboxkit.inbox.context import HandlerContext
from outboxkit.inbox.delivery import InboxCore
from outboxkit.inbox.lease import LeaseHandle
from outboxkit.inbox.policy import RetryPolicy
from outboxkit.inbox.steps import (
    CallHandler,
    CloseHandler,
    CommitHandler,
    OpenHandler,
    RunInSavepoint,
    RunInTransaction,
    StartLease,
    StartLeases,
    Step,
    drive_sync,
)

pytestmark = pytest.mark.unit


class Placed(Event, topic="orders", event_type="order.placed"):
    order_id: str


class Noted(Event, topic="orders", event_type="order.noted"):
    order_id: str


# -- grouping -------------------------------------------------------------------------------------
def _rounds(items: list[str], held: set[str] = frozenset()) -> list[list[str]]:
    """Items are "<partition><handler><n>": handler B has a batch handler, E does not."""
    return list(
        rounds(items, lambda i: i[0], lambda i: "B" if i[1] == "B" else None, held.__contains__)
    )


def test_a_group_takes_every_event_of_its_handler_when_nothing_is_in_between() -> None:
    assert _rounds(["0B1", "1B1", "0B2", "1B2"]) == [["0B1", "1B1", "0B2", "1B2"]]


def test_a_group_stops_in_a_partition_at_an_event_of_another_handler() -> None:
    items = ["0B1", "0E2", "0B3", "1B1", "1B2", "0B4"]
    assert _rounds(items) == [["0B1", "1B1", "1B2"], ["0E2"], ["0B3", "0B4"]]


def test_a_held_event_is_left_alone_and_blocks_its_partition() -> None:
    assert _rounds(["0E1", "0B2", "0B3", "1B1"], held={"0B2", "0B3"}) == [
        ["0E1"],
        ["0B2"],  # returned alone: the batch does not run it (it is held)
        ["0B3"],
        ["1B1"],
    ]
    assert _rounds(["1B1", "0B2", "1B3"], held={"0B2"}) == [["1B1", "1B3"], ["0B2"]]


# -- registry and context ------------------------------------------------------------------------
def test_registry_binds_batch_handlers_beside_per_event_ones() -> None:
    registry = EventRegistry()

    @registry.batch_handler(Placed)
    def bulk(events: Sequence[Placed], ctx: BatchContext, session: object) -> None:
        calls.append(([e.order_id for e in events], ctx.event_ids))

    calls: list[tuple[list[str], list[str]]] = []
    assert registry.batch_handler_for("order.placed") is bulk
    assert registry.batch_handlers == {"order.placed": bulk}
    one = registry.handler_for("order.placed")
    assert isinstance(one, OneAtATime)
    assert registry.handler_for("order.placed") is one  # the same object every time
    one(Placed(order_id="x"), _ctx("e1"), None)
    assert calls == [(["x"], ["e1"])]
    with pytest.raises(ConfigurationError, match="already has a handler"):
        registry.handler(Placed)(lambda *a: None)
    with pytest.raises(ConfigurationError, match="already has a handler"):
        registry.batch_handler(Placed)(lambda *a: None)
    registry.batch_handler(Placed)(bulk)  # the same function again: fine
    registry.handler(Noted)(lambda *a: None)
    with pytest.raises(ConfigurationError, match="already has a handler"):
        registry.batch_handler(Noted)(bulk)
    assert registry.batch_handler_for("order.noted") is None
    with pytest.raises(ConfigurationError, match="batch_handler\\(\\) takes the model"):
        registry.batch_handler()
    registry.check_handlers(coroutines=False, fallback=None)
    with pytest.raises(ConfigurationError, match="must be async"):
        registry.check_handlers(coroutines=True, fallback=None)


def test_an_async_batch_handler_is_refused_by_the_sync_inbox() -> None:
    registry = EventRegistry()

    @registry.batch_handler(pydantic.create_model("M", x=(int, 0)), event_type="m")
    async def bulk(events: Sequence[Any], ctx: BatchContext, session: object) -> None: ...

    registry.check_handlers(coroutines=True, fallback=None)
    with pytest.raises(ConfigurationError, match="must not be async"):
        registry.check_handlers(coroutines=False, fallback=None)


def test_a_batch_context_checks_every_lease() -> None:
    leases = {e: LeaseHandle(e, 1, 0.0) for e in ("a", "b")}
    ctx = BatchContext("c", (_ctx("a", leases["a"]), _ctx("b", leases["b"])))
    assert [c.event_id for c in ctx] == ["a", "b"] == ctx.event_ids
    assert (len(ctx), ctx[1].offset, ctx.idempotency_keys) == (2, 1, ["idem-a", "idem-b"])
    ctx.check()
    leases["b"].mark("cancelled")
    assert ctx.lease_lost
    with pytest.raises(LeaseLostError, match="'b' lost: cancelled"):
        ctx.check()


def _ctx(event_id: str, lease: LeaseHandle | None = None) -> HandlerContext:
    return HandlerContext(
        consumer="c",
        event_id=event_id,
        idempotency_key=f"idem-{event_id}",
        event_type="order.placed",
        headers={},
        attempt=1,
        topic="orders",
        partition=0,
        offset=1 if event_id == "b" else 0,
        lease_token=1,
        _lost_reason=(lambda: None) if lease is None else lease.reason,
    )


# -- the batch plan ------------------------------------------------------------------------------
class Db:
    """The scripted executor: claims, marks, leases, and the batch's transaction, whose
    writes (one per event a handler was called with) commit only with ``CommitHandler``."""

    def __init__(self, ids: list[str], attempts: int = 1) -> None:
        self.ids = ids
        self.attempts = attempts
        self.leases: dict[str, LeaseHandle] = {}
        self.pending: list[str] = []
        self.committed: list[str] = []
        self.steps: list[Step] = []
        self.refused: set[str] = set()  # marks refused although the lease looked fine
        self.lost_at_start: set[str] = set()  # leases lost before any handler ran

    def __call__(self, step: Step) -> Any:
        self.steps.append(step)
        if isinstance(step, StartLease):  # a record run alone
            return self.lease(step.event_id, step.token)
        if isinstance(step, StartLeases):
            return [self.lease(event_id, token) for event_id, token in step.claims]
        if isinstance(step, OpenHandler | CloseHandler):
            self.pending = []
        elif isinstance(step, CommitHandler):
            self.committed += self.pending
            self.pending = []
        elif isinstance(step, RunInTransaction):
            mark = len(self.pending)
            try:
                step.handler(*step.args, self.pending)
                for ctx in step.contexts:
                    ctx.check()
            except Exception:
                if isinstance(step, RunInSavepoint):  # else the plan rolls it all back
                    del self.pending[mark:]
                raise
        elif isinstance(step, CallHandler):  # a record run alone (takeover)
            self.pending = []
            step.handler(step.event, step.ctx, self.pending)
        name = getattr(getattr(step, "query", None), "name", "")
        if name == "claim_batch":
            rows = [(e, n, self.attempts, None) for n, e in enumerate(self.ids, start=1)]
            return Result(rows, len(rows))
        if name == "mark_succeeded_batch":
            ids = [
                e
                for e in step.params["event_ids"]  # type: ignore[attr-defined]
                if not self.leases[e].reason() and e not in self.refused
            ]
            return Result([(e,) for e in ids], len(ids))
        if name == "get_state":
            return Result([("processing", None)], 1)
        return Result([], 1)

    def lease(self, event_id: str, token: int) -> LeaseHandle:
        self.leases[event_id] = LeaseHandle(event_id, token, 0.0)
        if event_id in self.lost_at_start:
            self.leases[event_id].mark("cancelled")
        return self.leases[event_id]

    def release(self, in_flight: Step | None) -> None:
        return None

    def calls(self) -> list[list[str]]:
        """The event ids of each handler call, in order."""
        return [_ids(s.args[1]) for s in self.steps if isinstance(s, RunInTransaction)]

    def savepoints(self) -> list[bool]:
        """For each handler call: whether it ran in a savepoint."""
        return [
            isinstance(s, RunInSavepoint) for s in self.steps if isinstance(s, RunInTransaction)
        ]

    def sql(self, name: str) -> list[Any]:
        return [
            s.params for s in self.steps if getattr(getattr(s, "query", None), "name", "") == name
        ]


def _ids(ctx: HandlerContext | BatchContext) -> list[str]:
    return ctx.event_ids if isinstance(ctx, BatchContext) else [ctx.event_id]


def _env(
    event_id: str, offset: int, partition: int = 0, event_type: str = "order.placed"
) -> Envelope:
    return Envelope.from_parts(
        topic="orders",
        partition=partition,
        offset=offset,
        key=b"k",
        value=f'{{"order_id": "{event_id}"}}'.encode(),
        headers=[("event-id", event_id.encode()), ("event-type", event_type.encode())],
    )


def _run(
    envs: list[Envelope], db: Db, poison: set[str] = frozenset(), cancel: str | None = None
) -> BatchResult:
    registry = EventRegistry()

    @registry.batch_handler(Placed)
    def bulk(events: Sequence[Placed], ctx: BatchContext, session: list[str]) -> None:
        session.extend(e.order_id for e in events)
        if cancel is not None and cancel in ctx.event_ids:
            db.leases[cancel].mark("cancelled")
        if poison & set(ctx.event_ids):
            raise RuntimeError("poison")

    @registry.handler(Noted)
    def note(event: Noted, ctx: HandlerContext, session: list[str]) -> None:
        session.append(event.order_id)

    settings = InboxSettings(consumer="c", registry=registry, policy=RetryPolicy(max_attempts=3))
    core = InboxCore(settings, None, coroutines=False)
    return drive_sync(deliver_batch(core, envs, lambda tp: False, lambda *a: None), db)


def _kinds(result: BatchResult) -> dict[str, OutcomeKind]:
    return {env.headers["event-id"]: o.kind for env, o in result.outcomes}


def test_one_call_with_the_batch_s_events_one_mark_one_commit() -> None:
    envs = [_env("a", 0), _env("b", 0, partition=1), _env("c", 1)]
    db = Db(["a", "b", "c"])
    result = _run(envs, db)
    assert db.calls() == [["a", "b", "c"]]  # fetch order
    assert db.savepoints() == [False]  # optimistic: in the transaction itself
    assert _kinds(result) == dict.fromkeys("abc", OutcomeKind.SUCCEEDED)
    assert db.sql("mark_succeeded_batch")[0]["event_ids"] == ["a", "b", "c"]
    assert db.committed == ["a", "b", "c"]
    assert [type(s).__name__ for s in db.steps].count("CommitHandler") == 1


def test_a_poison_event_fails_alone_and_the_others_commit_once() -> None:
    envs = [_env("a", 0), _env("bad", 1), _env("c", 2), _env("d", 0, partition=1)]
    db = Db(["a", "bad", "c", "d"])
    result = _run(envs, db, poison={"bad"})
    # The bulk call (rolled back), then one by one: c waits behind bad in its partition.
    assert db.calls() == [["a", "bad", "c", "d"], ["a"], ["bad"], ["d"]]
    assert db.savepoints() == [False, True, True, True]  # the failure's rerun: savepoints
    assert _kinds(result) == {
        "a": OutcomeKind.SUCCEEDED,
        "bad": OutcomeKind.RETRY,
        "d": OutcomeKind.SUCCEEDED,
    }
    assert result.rest == []  # the seek back to bad delivers c again
    assert db.committed == ["a", "d"]
    assert db.sql("release_batch")[0]["event_ids"] == ["c"]  # not counted as an attempt
    failure = db.sql("record_failure")
    assert [p["event_id"] for p in failure] == ["bad"]  # one attempt, recorded once


def test_a_cancel_during_the_bulk_call_drops_that_event_without_calling_it_again() -> None:
    envs = [_env("a", 0), _env("gone", 0, partition=1), _env("b", 1)]
    db = Db(["a", "gone", "b"])
    result = _run(envs, db, cancel="gone")
    assert db.calls() == [["a", "gone", "b"], ["a"], ["b"]]
    assert _kinds(result)["gone"] is OutcomeKind.LEASE_LOST  # get_state says processing here
    assert _kinds(result)["a"] is _kinds(result)["b"] is OutcomeKind.SUCCEEDED
    assert db.committed == ["a", "b"]


def test_a_lease_lost_before_the_call_is_not_called_and_the_others_run_alone() -> None:
    envs = [_env("a", 0), _env("gone", 0, partition=1), _env("b", 1)]
    db = Db(["a", "gone", "b"])
    db.lost_at_start = {"gone"}
    result = _run(envs, db)
    # No bulk call with a known loss in it; the optimistic run ends at gone (a failure),
    # the run with savepoints leaves gone out.
    assert db.calls() == [["a"], ["a"], ["b"]]
    assert db.committed == ["a", "b"]
    assert _kinds(result)["gone"] is OutcomeKind.LEASE_LOST


def test_a_refused_mark_runs_the_others_again_in_one_call() -> None:
    envs = [_env("a", 0), _env("fenced", 0, partition=1), _env("b", 1)]
    db = Db(["a", "fenced", "b"])
    db.refused = {"fenced"}  # taken over after its lease was last checked
    result = _run(envs, db)
    assert db.calls() == [["a", "fenced", "b"], ["a", "b"]]
    assert db.savepoints() == [False, True]
    assert db.committed == ["a", "b"]
    assert _kinds(result)["fenced"] is OutcomeKind.LEASE_LOST


def test_events_of_a_per_event_handler_keep_their_place_in_the_partition() -> None:
    envs = [
        _env("p1", 0),
        _env("n2", 1, event_type="order.noted"),
        _env("p3", 2),
        _env("q1", 0, partition=1),
    ]
    db = Db(["p1", "n2", "p3", "q1"])
    result = _run(envs, db)
    assert db.calls() == [["p1", "q1"], ["n2"], ["p3"]]
    assert db.committed == ["p1", "q1", "n2", "p3"]
    assert set(_kinds(result).values()) == {OutcomeKind.SUCCEEDED}


def test_a_retried_event_runs_alone_through_the_batch_handler() -> None:
    db = Db(["again", "x"], attempts=2)
    result = _run([_env("again", 0), _env("x", 1)], db)
    called = [s for s in db.steps if isinstance(s, CallHandler)]
    assert [type(s.handler) for s in called] == [OneAtATime]
    assert db.committed == ["again"]
    assert result.rest == [1]
    assert _kinds(result) == {"again": OutcomeKind.SUCCEEDED}
