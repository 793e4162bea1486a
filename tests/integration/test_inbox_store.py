"""The inbox row's state machine against the real PostgreSQL (no Kafka: envelopes are built)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outboxkit import db
from outboxkit.errors import ConfigurationError, RetentionWindowError
from outboxkit.inbox import (
    AsyncInbox,
    Envelope,
    EventRegistry,
    HandlerContext,
    Inbox,
    InboxSettings,
    OutcomeKind,
    RetryPolicy,
)
from outboxkit.inbox.readback import (
    CancelResult,
    cancel_event,
    get_event,
    list_events,
    list_rejections,
    stats,
)
from outboxkit.inbox.retention import check_window, purge_finished
from outboxkit.inbox.steps import Sql, TableExecutor, drive_sync
from outboxkit.inbox.store import InboxStatements
from outboxkit.kafka import KafkaClients
from outboxkit.schema import InboxState
from outboxkit.settings import KafkaSettings
from tests.integration.inbox_support import (
    EFFECT_DDL,
    INSERT_EFFECT,
    REGISTRY,
    PaymentRequested,
    claim,
    effects,
    headers_for,
    payload,
    run_sql,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(sa_url: str, outboxkit_db_url: str) -> Iterator[Engine]:
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    # A lock wait longer than 5 s fails the statement instead of hanging the test.
    eng = create_engine(sa_url, connect_args={"options": "-c lock_timeout=5000"})
    try:
        yield eng
    finally:
        eng.dispose()


def _env(
    event_id: str, amount: int = 1, offset: int = 0, timestamp_ms: int | None = None
) -> Envelope:
    return Envelope.from_parts(
        topic="orders",
        partition=0,
        offset=offset,
        key=b"k",
        value=payload("o1", amount),
        headers=headers_for(event_id),
        timestamp_ms=timestamp_ms,
    )


def _store(owner: str) -> InboxStatements:
    return InboxStatements("billing", owner=owner, lease_seconds=30)


def _succeeded(engine: Engine, store: InboxStatements, event_id: str, token: int) -> int:
    step = store.succeeded(event_id, token)
    with engine.begin() as conn:
        return db.execute(conn, step.query, step.params)


def _effect_handler(event: Any, ctx: HandlerContext, session: Session) -> None:
    session.execute(
        INSERT_EFFECT,
        {
            "event_id": ctx.event_id,
            "order_id": event.order_id,
            "amount": event.amount,
            "attempt": ctx.attempt,
        },
    )


def test_a_newer_claim_fences_the_older_handler(engine: Engine) -> None:
    event_id = str(uuid.uuid4())
    env = _env(event_id)
    old, new = _store("zombie"), _store("successor")
    first = claim(engine, old, env)
    second = claim(engine, new, env)
    assert (first.kind, second.kind) == ("claimed", "claimed")
    assert second.token > first.token
    assert second.attempts == 2
    assert run_sql(engine, old.renew(event_id, first.token)).rowcount == 0
    assert _succeeded(engine, old, event_id, first.token) == 0  # the zombie's late success
    assert _succeeded(engine, new, event_id, second.token) == 1
    assert claim(engine, new, env).kind == "duplicate"


def test_a_give_back_made_twice_takes_one_attempt_back(engine: Engine) -> None:
    """A give-back whose reply was lost is owed and made again: it must find nothing left to
    give back (before, the second one took the attempt back once more: ``attempts = -1``)."""
    event_id = str(uuid.uuid4())
    env = _env(event_id)
    store = _store("me")
    token = claim(engine, store, env).token
    assert run_sql(engine, store.release_batch([(event_id, token)])).rowcount == 1
    assert run_sql(engine, store.release_batch([(event_id, token)])).rowcount == 0
    again = claim(engine, store, env)
    assert (again.kind, again.attempts) == ("claimed", 1)
    assert again.token > token


def test_terminal_states_are_never_overwritten(engine: Engine, outboxkit_db_url: str) -> None:
    event_id = str(uuid.uuid4())
    env = _env(event_id)
    store = _store("me")
    token = claim(engine, store, env).token
    for step, matched in [
        (store.finish(event_id, token, InboxState.DEAD, "gave up"), 1),
        (store.finish(event_id, token, InboxState.REJECTED, "again"), 0),
        (store.record_failure(event_id, token, "late failure"), 0),
        (store.renew(event_id, token), 0),
    ]:
        assert run_sql(engine, step).rowcount == matched
    result = cancel_event(engine, "billing", event_id)
    assert (result.cancelled, result.state) == (False, "dead")
    assert claim(engine, store, env).kind == "duplicate"
    record = get_event(engine, "billing", event_id)
    assert record is not None
    assert (record.state, record.last_error, record.duplicate_count) == ("dead", "gave up", 1)
    with psycopg.connect(outboxkit_db_url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "UPDATE outboxkit.inbox_message SET state = 'finished' WHERE event_id = %s", (event_id,)
        )


def test_cancel_does_not_wait_for_a_running_handler(engine: Engine, outboxkit_db_url: str) -> None:
    event_id = str(uuid.uuid4())
    env = _env(event_id)
    store = _store("me")
    token = claim(engine, store, env).token
    with Session(engine) as handler_tx:  # the handler's open transaction with its effects
        _effect_handler(
            REGISTRY.decode("payment.requested", "application/json", env.value),
            _ctx(event_id, token),
            handler_tx,
        )
        # Had it waited for the handler's row lock, the engine's lock_timeout (5 s) would raise.
        result = cancel_event(engine, "billing", event_id, reason="stop")
        assert (result.cancelled, result.state) == (True, "cancelled")
        step = store.succeeded(event_id, token)
        assert db.execute(handler_tx, step.query, step.params) == 0
        handler_tx.rollback()
    assert effects(outboxkit_db_url) == []
    record = get_event(engine, "billing", event_id)
    assert record is not None
    assert (record.state, record.last_error) == ("cancelled", "stop")


def _ctx(event_id: str, token: int) -> HandlerContext:
    return HandlerContext(
        consumer="billing",
        event_id=event_id,
        idempotency_key="k",
        event_type="payment.requested",
        headers={},
        attempt=1,
        topic="orders",
        partition=0,
        offset=0,
        lease_token=token,
    )


def test_cancel_before_delivery_makes_the_delivery_a_skip(
    engine: Engine, outboxkit_db_url: str
) -> None:
    event_id = str(uuid.uuid4())
    assert cancel_event(engine, "billing", event_id) == CancelResult(False, None)
    assert cancel_event(engine, "billing", event_id, before_delivery=True).cancelled
    inbox = Inbox(engine, _effect_handler, InboxSettings(consumer="billing", registry=REGISTRY))
    outcome = inbox.process(_env(event_id))
    assert outcome.kind is OutcomeKind.DUPLICATE
    assert effects(outboxkit_db_url) == []


def test_inbox_process_runs_once_and_reads_back(engine: Engine) -> None:
    inbox = Inbox(engine, _effect_handler, InboxSettings(consumer="billing", registry=REGISTRY))
    event_id = str(uuid.uuid4())
    assert inbox.process(_env(event_id)).kind is OutcomeKind.SUCCEEDED
    assert inbox.process(_env(event_id, offset=1)).kind is OutcomeKind.DUPLICATE
    conflict = inbox.process(_env(event_id, amount=2, offset=2))
    assert conflict.kind is OutcomeKind.REJECTED
    no_id = Envelope.from_parts(
        topic="orders", partition=0, offset=3, key=None, value=b"x", headers=[]
    )
    assert inbox.process(no_id).kind is OutcomeKind.REJECTED
    counts = {(s.consumer, s.state): (s.events, s.duplicates) for s in stats(engine)}
    assert counts == {("billing", "succeeded"): (1, 1), ("billing", "rejection_log"): (2, 0)}
    assert [r.state for r in list_events(engine, consumer="billing")] == ["succeeded"]
    assert list_events(engine, state="dead") == []
    assert [r.kafka_offset for r in list_rejections(engine, consumer="billing")] == [3, 2]
    assert [r.kafka_offset for r in list_rejections(engine, event_id=event_id)] == [2]


def test_crash_looping_event_goes_dead_without_running_again(engine: Engine) -> None:
    calls: list[int] = []
    dead_letters: list[tuple[str, str, int]] = []

    def handler(event: Any, ctx: HandlerContext, session: Session) -> None:
        calls.append(ctx.attempt)

    settings = InboxSettings(
        consumer="billing", registry=REGISTRY, policy=RetryPolicy(max_attempts=2)
    )
    inbox = Inbox(engine, handler, settings)
    event_id = str(uuid.uuid4())
    env = _env(event_id)
    for _ in range(2):  # two runs that "crashed" after claiming (never settled)
        claim(engine, inbox.core.statements, env)
    outcome = inbox.process(env, dead_letter=lambda e, i, err, n: dead_letters.append((i, err, n)))
    assert outcome.kind is OutcomeKind.DEAD
    assert calls == []
    assert dead_letters == [(event_id, "attempts exhausted; last error: None", 3)]


def test_a_record_given_up_ends_its_row_dead_with_its_attempts(engine: Engine) -> None:
    """Given up after unexpected errors (outside the handler): the unfinished row ends dead and
    the outcome (and so its acknowledgement) carries the row's attempts; given up again, the
    row is finished already and only the rejection log takes the delivery."""
    inbox = Inbox(engine, _effect_handler, InboxSettings(consumer="billing", registry=REGISTRY))
    env = _env(str(uuid.uuid4()))
    for _ in range(2):  # two claims that never settled
        claim(engine, inbox.core.statements, env)
    executor = TableExecutor({Sql: lambda step: run_sql(engine, step)})
    first = drive_sync(inbox.core.give_up(env, "DataError: x", 3), executor)
    assert (first.kind, first.row_dead, first.attempts) == (OutcomeKind.REJECTED, True, 2)
    again = drive_sync(inbox.core.give_up(env, "DataError: x", 3), executor)
    assert (again.row_dead, again.attempts, again.rejection_log) == (False, 0, True)


def test_replay_older_than_the_window_is_refused_unless_known(
    engine: Engine, outboxkit_db_url: str
) -> None:
    settings = InboxSettings(consumer="billing", registry=REGISTRY, replay_window=3600)
    inbox = Inbox(engine, _effect_handler, settings)
    old_ms = int((time.time() - 7200) * 1000)
    known, forgotten = str(uuid.uuid4()), str(uuid.uuid4())
    assert inbox.process(_env(known)).kind is OutcomeKind.SUCCEEDED
    assert inbox.process(_env(known, offset=1, timestamp_ms=old_ms)).kind is OutcomeKind.DUPLICATE
    refused = inbox.process(_env(forgotten, offset=2, timestamp_ms=old_ms))
    assert refused.kind is OutcomeKind.REJECTED
    assert "older than the dedup retention window" in (refused.error or "")
    assert [e[0] for e in effects(outboxkit_db_url)] == [known]


def test_purge_removes_old_terminal_rows_in_small_batches(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO outboxkit.inbox_message (consumer, event_id, state, finished_at)"
                " SELECT 'c', 'old-' || g, 'succeeded', now() - interval '2 days'"
                " FROM generate_series(1, 5) g"
            )
        )
        conn.execute(
            text(
                "INSERT INTO outboxkit.inbox_message (consumer, event_id, state, finished_at)"
                " VALUES ('c', 'recent', 'dead', now()), ('c', 'running', 'processing', NULL)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO outboxkit.inbox_rejection"
                " (consumer, reason, topic, kafka_partition, kafka_offset, created_at)"
                " VALUES ('c', 'x', 't', 0, 1, now() - interval '2 days'),"
                " ('c', 'y', 't', 0, 2, now())"
            )
        )
    result = purge_finished(engine, consumer="c", window_seconds=86400, batch_size=2)
    assert (result.messages, result.rejections) == (5, 1)
    assert result.batches == 3 + 1
    with engine.begin() as conn:
        left = conn.execute(text("SELECT event_id FROM outboxkit.inbox_message ORDER BY 1"))
        assert [r[0] for r in left] == ["recent", "running"]
        assert conn.execute(text("SELECT count(*) FROM outboxkit.inbox_rejection")).scalar() == 1


def test_purge_judges_the_window_against_an_injected_now(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO outboxkit.inbox_message (consumer, event_id, state, finished_at)"
                " VALUES ('c', 'today', 'succeeded', now())"
            )
        )
    assert purge_finished(engine, consumer="c", window_seconds=86400).messages == 0
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    assert purge_finished(engine, consumer="c", window_seconds=86400, now=later).messages == 1


def test_window_is_checked_against_topic_retention(
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = outboxkit_topic(config={"retention.ms": str(3_600_000)})

    async def check(window: float, *, strict: bool = False) -> list[str]:
        admin = KafkaClients(KafkaSettings(bootstrap=outboxkit_kafka_bootstrap)).admin()
        try:
            return await check_window(admin, [topic], window_seconds=window, strict=strict)
        finally:
            await admin.close()

    assert asyncio.run(check(7200)) == []
    with caplog.at_level(logging.WARNING, logger="outboxkit.inbox.retention"):
        problems = asyncio.run(check(60))
    assert len(problems) == 1
    assert "3600 s" in problems[0]
    assert problems[0] in caplog.text
    with pytest.raises(RetentionWindowError):
        asyncio.run(check(60, strict=True))


def test_a_handler_cannot_commit_its_own_session(engine: Engine, outboxkit_db_url: str) -> None:
    def committing(event: Any, ctx: HandlerContext, session: Session) -> None:
        _effect_handler(event, ctx, session)
        session.commit()

    settings = InboxSettings(consumer="billing", registry=REGISTRY, policy=RetryPolicy(3))
    inbox = Inbox(engine, committing, settings)
    try:
        outcome = inbox.process(_env(str(uuid.uuid4())))
    finally:
        inbox.close()
    assert outcome.kind is OutcomeKind.RETRY
    assert "HandlerCommitError" in (outcome.error or "")
    assert effects(outboxkit_db_url) == []


@pytest.mark.parametrize("isolation", [None, "SERIALIZABLE"])
def test_a_long_handler_keeps_its_lease_renewed(
    engine: Engine, outboxkit_db_url: str, isolation: str | None
) -> None:
    """Also with an engine whose transactions are SERIALIZABLE (or REPEATABLE READ; a server's
    default does the same): the handler's transaction still runs at READ COMMITTED, or the
    renewals of its row made its mark fail with a serialization failure, every time. Set as
    the engine's own option, the level also won over the autocommit of the claims: they never
    committed, and the event was lost to its lease at the first renewal."""
    if isolation is not None:
        engine = engine.execution_options(isolation_level=isolation)
    seen: list[Any] = []

    def slow(event: Any, ctx: HandlerContext, session: Session) -> None:
        _effect_handler(event, ctx, session)
        for _ in range(80):  # ~4 s, far beyond the 1.5 s lease
            ctx.check()
            with psycopg.connect(outboxkit_db_url) as conn:
                row = conn.execute(
                    "SELECT lease_expires_at > now(), lease_expires_at"
                    " FROM outboxkit.inbox_message WHERE event_id = %s",
                    (ctx.event_id,),
                ).fetchone()
            seen.append(row)
            time.sleep(0.05)

    settings = InboxSettings(consumer="billing", registry=REGISTRY, lease_seconds=1.5)
    inbox = Inbox(engine, slow, settings)
    try:
        outcome = inbox.process(_env(str(uuid.uuid4())))
    finally:
        inbox.close()
    assert outcome.kind is OutcomeKind.SUCCEEDED
    assert all(alive for alive, _ in seen)  # never expired while the handler ran
    assert len({expires for _, expires in seen}) >= 3  # renewed several times


def test_a_cancelled_event_is_not_dead_lettered(engine: Engine, outboxkit_db_url: str) -> None:
    dead_letters: list[str] = []

    def fail_after_cancel(event: Any, ctx: HandlerContext, session: Session) -> None:
        cancel_event(engine, "billing", ctx.event_id)
        raise RuntimeError("gave up")

    settings = InboxSettings(consumer="billing", registry=REGISTRY, policy=RetryPolicy(1))
    inbox = Inbox(engine, fail_after_cancel, settings)
    event_id = str(uuid.uuid4())
    try:
        outcome = inbox.process(
            _env(event_id), dead_letter=lambda e, i, err, n: dead_letters.append(i)
        )
    finally:
        inbox.close()
    assert outcome.kind is OutcomeKind.CANCELLED
    assert dead_letters == []
    assert _state_of(outboxkit_db_url, event_id) == "cancelled"


def test_registry_handlers_are_dispatched_by_event_type(
    engine: Engine, outboxkit_db_url: str
) -> None:
    registry = EventRegistry()

    @registry.handler(PaymentRequested)
    def pay(event: PaymentRequested, ctx: HandlerContext, session: Session) -> None:
        _effect_handler(event, ctx, session)

    inbox = Inbox(engine, InboxSettings(consumer="billing", registry=registry))
    paid, other = str(uuid.uuid4()), str(uuid.uuid4())
    unhandled = Envelope.from_parts(
        topic="orders",
        partition=0,
        offset=5,
        key=b"k",
        value=b"{}",
        headers=headers_for(other, event_type="order.shipped"),
    )
    try:
        assert inbox.process(_env(paid)).kind is OutcomeKind.SUCCEEDED
        refused = inbox.process(unhandled)
    finally:
        inbox.close()
    assert refused.kind is OutcomeKind.REJECTED
    assert "unknown event type 'order.shipped'" in (refused.error or "")
    assert [e[0] for e in effects(outboxkit_db_url)] == [paid]

    @registry.handler(PaymentRequested, event_type="payment.async")
    async def wrong(event: Any, ctx: HandlerContext, session: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="must not be async"):
        Inbox(engine, InboxSettings(consumer="billing", registry=registry))


def test_on_an_autocommit_engine_a_failing_handler_still_writes_nothing(
    sa_url: str, outboxkit_db_url: str
) -> None:
    """The handler's transaction is one transaction even on an engine made with
    ``isolation_level="AUTOCOMMIT"``: each of its statements used to commit at once. Also after
    the handler's own rollback, which begins its next transaction on the same connection."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)

    def half_done(event: Any, ctx: HandlerContext, session: Session) -> None:
        _effect_handler(event, ctx, session)
        session.rollback()
        _effect_handler(event, ctx, session)
        raise RuntimeError("failed after its writes")

    engine = create_engine(sa_url, isolation_level="AUTOCOMMIT")
    settings = InboxSettings(consumer="billing", registry=REGISTRY)
    inbox = Inbox(engine, half_done, settings)
    event_id = str(uuid.uuid4())
    try:
        outcome = inbox.process(_env(event_id))
    finally:
        inbox.close()
        engine.dispose()
    assert outcome.kind is OutcomeKind.RETRY
    assert effects(outboxkit_db_url) == []
    assert _state_of(outboxkit_db_url, event_id) == "processing"


async def test_a_long_async_handler_on_a_serializable_engine_succeeds(
    sa_url: str, outboxkit_db_url: str
) -> None:
    """The async driver's handler transaction runs at READ COMMITTED too (see the sync test)."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)

    async def slow(event: Any, ctx: HandlerContext, session: AsyncSession) -> None:
        await session.execute(INSERT_EFFECT, _params(event, ctx))
        await session.rollback()  # its next transaction: at READ COMMITTED too
        await session.execute(INSERT_EFFECT, _params(event, ctx))
        renewed, deadline = _expiry(outboxkit_db_url, ctx.event_id), time.monotonic() + 30
        while _expiry(outboxkit_db_url, ctx.event_id) == renewed:  # until a renewal commits
            ctx.check()
            assert time.monotonic() < deadline, "no renewal in 30 s"
            await asyncio.sleep(0.05)

    engine = create_async_engine(sa_url).execution_options(isolation_level="SERIALIZABLE")
    settings = InboxSettings(consumer="billing", registry=REGISTRY, lease_seconds=1.5)
    inbox = AsyncInbox(engine, slow, settings)
    try:
        outcome = await inbox.process(_env(str(uuid.uuid4())))
    finally:
        await inbox.close()
        await engine.dispose()
    assert outcome.kind is OutcomeKind.SUCCEEDED
    assert len(effects(outboxkit_db_url)) == 1


def test_an_engine_whose_connect_listener_runs_sql_is_served(
    sa_url: str, outboxkit_db_url: str
) -> None:
    """A listener of the application's (``SET application_name``) begins a transaction on each
    connection it is handed: the middleware commits it before it sets its own level, which
    cannot change inside a transaction."""
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    engine = create_engine(sa_url)
    event.listen(
        engine, "engine_connect", lambda conn: conn.exec_driver_sql("SET timezone = 'UTC'")
    )
    inbox = Inbox(engine, _effect_handler, InboxSettings(consumer="billing", registry=REGISTRY))
    try:
        outcome = inbox.process(_env(str(uuid.uuid4())))
    finally:
        inbox.close()
        engine.dispose()
    assert outcome.kind is OutcomeKind.SUCCEEDED
    assert len(effects(outboxkit_db_url)) == 1


def test_a_handler_using_its_sessions_bind_first_still_commits(
    engine: Engine, outboxkit_db_url: str
) -> None:
    """A handler may run SQL on ``session.get_bind()`` before its session's first statement: that
    begins the connection's transaction, which the session must still commit (as a guest in
    it, its commit committed nothing, and closing the connection rolled the handler's writes
    and the mark back after the event counted as succeeded)."""

    def via_bind(event: Any, ctx: HandlerContext, session: Session) -> None:
        session.get_bind().execute(text("SELECT 1"))  # type: ignore[union-attr]
        _effect_handler(event, ctx, session)

    inbox = Inbox(engine, via_bind, InboxSettings(consumer="billing", registry=REGISTRY))
    event_id = str(uuid.uuid4())
    try:
        outcome = inbox.process(_env(event_id))
    finally:
        inbox.close()
    assert outcome.kind is OutcomeKind.SUCCEEDED
    assert len(effects(outboxkit_db_url)) == 1
    assert _state_of(outboxkit_db_url, event_id) == "succeeded"


def _expiry(db_url: str, event_id: str) -> Any:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT lease_expires_at FROM outboxkit.inbox_message WHERE event_id = %s",
            (event_id,),
        ).fetchone()
    assert row is not None, "the claim is not committed"
    return row[0]


def _state_of(db_url: str, event_id: str) -> str:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT state FROM outboxkit.inbox_message WHERE event_id = %s", (event_id,)
        ).fetchone()
    assert row is not None
    return str(row[0])


async def test_the_async_inbox_refuses_a_handler_commit_and_dead_letters(
    sa_url: str, outboxkit_db_url: str
) -> None:
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    letters: list[tuple[str, int]] = []

    async def committing(event: Any, ctx: HandlerContext, session: AsyncSession) -> None:
        await session.execute(INSERT_EFFECT, _params(event, ctx))
        await session.commit()

    async def dead_letter(env: Envelope, event_id: str, error: str, attempts: int) -> None:
        letters.append((event_id, attempts))

    engine = create_async_engine(sa_url)
    settings = InboxSettings(consumer="billing", registry=REGISTRY, policy=RetryPolicy(2))
    inbox = AsyncInbox(engine, committing, settings)
    event_id = str(uuid.uuid4())
    try:
        first = await inbox.process(_env(event_id), dead_letter=dead_letter)
        second = await inbox.process(_env(event_id), dead_letter=dead_letter)
    finally:
        await inbox.close()
        await engine.dispose()
    assert first.kind is OutcomeKind.RETRY
    assert "HandlerCommitError" in (first.error or "")
    assert second.kind is OutcomeKind.DEAD
    assert letters == [(event_id, 2)]
    assert effects(outboxkit_db_url) == []
    assert _state_of(outboxkit_db_url, event_id) == "dead"


def _params(event: Any, ctx: HandlerContext) -> dict[str, Any]:
    return {
        "event_id": ctx.event_id,
        "order_id": event.order_id,
        "amount": event.amount,
        "attempt": ctx.attempt,
    }
