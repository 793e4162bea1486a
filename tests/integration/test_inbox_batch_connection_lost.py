"""A batch whose connection the server ends while one handler waits with its transaction open and
no statement running (``idle_in_transaction_session_timeout``, which operators often set): the
batch's transaction is gone, so it runs again one by one and only the handler that waited pays
for it. Before, the handler that ran next in the batch failed on the dead connection and was
charged the attempt, and the rerun in savepoints broke off with SQLAlchemy's
``PendingRollbackError``."""

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


def test_a_handler_idle_past_the_servers_timeout_pays_for_it_alone(
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    database = outboxkit_db_url.rsplit("/", 1)[1]
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout = '1s'").format(
                sql.Identifier(database)
            )
        )
    topic = outboxkit_topic()
    ids = [str(uuid.uuid4()) for _ in range(5)]
    idle = ids[1]  # the handlers after it run in the same transaction, after its wait
    for n, event_id in enumerate(ids):
        produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o-{n}", n + 1)
    harness = start(
        [topic],
        IdleAfterWrite(fail_only=idle),
        policy=RetryPolicy(max_attempts=2, initial_delay=0.1),
        consumer_options={"batch_max_records": 50},
    )
    harness.wait_outcomes(*ids)
    row = inbox_row(outboxkit_db_url, "billing", idle)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("dead", 2)
    assert "IdleInTransactionSessionTimeout" in row["last_error"]
    assert effects(outboxkit_db_url, idle) == []
    for event_id in ids:
        if event_id == idle:
            continue
        row = inbox_row(outboxkit_db_url, "billing", event_id)
        assert row is not None
        assert (row["state"], row["attempts"]) == ("succeeded", 1), event_id
        assert len(effects(outboxkit_db_url, event_id)) == 1
    assert "the batch's connection was lost during a handler" in caplog.text
    assert "PendingRollbackError" not in caplog.text
