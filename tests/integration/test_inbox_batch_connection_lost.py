"""A batch whose connection the server ends while one handler waits with its transaction open and
no statement running (``idle_in_transaction_session_timeout``, which operators often set): the
batch's transaction is gone, so it runs again one by one and only the handler that waited pays
for it. Before, the handler that ran next in the batch failed on the dead connection and was
charged the attempt: in the batch's first run, or in its rerun in savepoints, where the wait
shows first at the savepoint's release (which also broke off with SQLAlchemy's
``PendingRollbackError``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from outboxkit.inbox import HandlerContext, RetryPolicy
from tests.integration.inbox_support import Behaviour, Harness, effects, inbox_row, produce_event
from tests.integration.test_inbox_conformance import adapter, start  # noqa: F401
from tests.support.db_names import database_of

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
Start = Callable[..., Harness]
IDLE_SECONDS = 1.5  # past the server's timeout of 1 s


@dataclass
class IdleAfterWrite(Behaviour):
    """Writes its effect row, then (for ``fail_only``, every attempt) waits past the server's
    idle-in-transaction timeout, its transaction open."""

    def before_return(self, ctx: HandlerContext) -> None:
        self.calls.append((ctx.event_id, ctx.attempt))
        if ctx.event_id == self.fail_only:
            time.sleep(IDLE_SECONDS)


def _idle_timeout(db_url: str) -> None:
    database = database_of(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout = '1s'").format(
                sql.Identifier(database)
            )
        )


def _ended(db_url: str, event_id: str) -> tuple[str, int, str | None]:
    row = inbox_row(db_url, "billing", event_id)
    assert row is not None
    return row["state"], row["attempts"], row["last_error"]


def _succeeded_once(db_url: str, event_ids: list[str]) -> None:
    for event_id in event_ids:
        assert _ended(db_url, event_id)[:2] == ("succeeded", 1), event_id
        assert len(effects(db_url, event_id)) == 1


def _paid_alone(db_url: str, idle: str, caplog: pytest.LogCaptureFixture) -> None:
    state, attempts, error = _ended(db_url, idle)
    assert (state, attempts) == ("dead", 2)
    assert "IdleInTransactionSessionTimeout" in (error or "")
    assert effects(db_url, idle) == []
    assert "the batch's connection was lost during a handler" in caplog.text
    assert "PendingRollbackError" not in caplog.text


def test_a_handler_idle_past_the_servers_timeout_pays_for_it_alone(
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _idle_timeout(outboxkit_db_url)
    topic = outboxkit_topic()
    ids = [str(uuid.uuid4()) for _ in range(5)]
    idle = ids[0]  # the handlers after it run in the same transaction, after its wait
    for n, event_id in enumerate(ids):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o-{n}", n + 1)
    harness = start(
        [topic],
        IdleAfterWrite(fail_only=idle),
        policy=RetryPolicy(max_attempts=2, initial_delay=0.1),
        dead_letter=outboxkit_topic(prefix="dlq"),
        consumer_options={"batch_max_records": 50},
    )
    harness.wait_outcomes(*ids)
    _succeeded_once(outboxkit_db_url, ids[1:])
    _paid_alone(outboxkit_db_url, idle, caplog)


@dataclass
class IdleOnceFailed(Behaviour):
    """``failing`` raises after its write, always; ``fail_only`` waits past the timeout once
    ``failing`` was called. The batch's first run stops at ``failing`` (whichever partition came
    first), so the first wait is in the batch's rerun in savepoints."""

    failing: str = ""

    def before_return(self, ctx: HandlerContext) -> None:
        self.calls.append((ctx.event_id, ctx.attempt))
        if ctx.event_id == self.fail_only and any(e == self.failing for e, _ in self.calls):
            time.sleep(IDLE_SECONDS)
        if ctx.event_id == self.failing:
            raise RuntimeError("boom")


def test_an_idle_handler_in_the_batchs_run_in_savepoints_pays_for_it_alone(
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failing handler in one partition makes the batch run again in savepoints; in another
    a handler's wait in that rerun shows first at its savepoint's release, and a handler of a
    third partition run after it must not pay for it (before, it failed on the ended session
    and was charged; the log said ``PendingRollbackError`` when it ran before the wait)."""
    _idle_timeout(outboxkit_db_url)
    topic = outboxkit_topic(partitions=3)
    failing, idle, after = (str(uuid.uuid4()) for _ in range(3))
    produce_event(outboxkit_kafka_bootstrap, topic, failing, "o-failing", 1, partition=0)
    produce_event(outboxkit_kafka_bootstrap, topic, idle, "o-idle", 2, partition=1)
    produce_event(outboxkit_kafka_bootstrap, topic, after, "o-after", 3, partition=2)
    harness = start(
        [topic],
        IdleOnceFailed(fail_only=idle, failing=failing),
        policy=RetryPolicy(max_attempts=2, initial_delay=0.1),
        dead_letter=outboxkit_topic(prefix="dlq"),
        consumer_options={"batch_max_records": 3, "batch_max_ms": 2_000},  # all three at once
    )
    harness.wait_outcomes(failing, idle, after)
    _succeeded_once(outboxkit_db_url, [after])
    _paid_alone(outboxkit_db_url, idle, caplog)
    assert _ended(outboxkit_db_url, failing)[:2] == ("dead", 2)
