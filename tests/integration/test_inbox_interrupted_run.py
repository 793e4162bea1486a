"""A run the database interrupts is no attempt when records are handled one by one, as in a
batch: the ``succeeded`` mark cancelled while it waits on a row lock (57014), or the handler's
session terminated while the handler runs (57P01), gives the claim back and the record is
retried; with ``max_attempts=1`` the event then succeeds with ``attempts = 1``. Before, both
ended a valid event ``dead`` after its one attempt, its effect never applied."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import psycopg
import pytest

from outboxkit.inbox import HandlerContext, RetryPolicy
from tests.integration.inbox_support import Behaviour, Harness, effects, inbox_row, produce_event
from tests.integration.test_inbox_conformance import adapter, start  # noqa: F401
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
Start = Callable[..., Harness]
ONE_BY_ONE = {"batch_max_records": 1}


@dataclass
class HeldOnce(Behaviour):
    """The first call, after writing its effect, waits until the test sets ``go`` (a few
    milliseconds: it blocks the async driver's loop); later calls return at once."""

    go: threading.Event = field(default_factory=threading.Event)
    held: bool = False

    def before_return(self, ctx: HandlerContext) -> None:
        self.calls.append((ctx.event_id, ctx.attempt))
        if not self.held:
            self.held = True
            assert self.go.wait(30), "the test never let the handler go on"


@pytest.fixture
def admin(outboxkit_db_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        yield conn


def _signal(admin: psycopg.Connection[tuple[object, ...]], fn: str, where: str) -> bool:
    """``fn`` (pg_cancel_backend, pg_terminate_backend) on the sessions of this database that
    ``where`` picks; whether there was one."""
    rows = admin.execute(
        f"SELECT {fn}(pid) FROM pg_stat_activity"
        f" WHERE datname = current_database() AND pid <> pg_backend_pid() AND {where}"
    ).fetchall()
    return bool(rows) and all(row[0] for row in rows)


def _succeeded_once(db_url: str, event_id: str, behaviour: HeldOnce) -> None:
    row = inbox_row(db_url, "billing", event_id)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("succeeded", 1), row["last_error"]
    assert len(effects(db_url, event_id)) == 1
    assert [call[0] for call in behaviour.calls] == [event_id, event_id]  # ran again


def test_a_cancelled_succeeded_mark_is_no_attempt(
    start: Start,  # noqa: F811
    admin: psycopg.Connection[tuple[object, ...]],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic, event_id, behaviour = outboxkit_topic(), str(uuid.uuid4()), HeldOnce()
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o-1", 1)
    harness = start(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=1),
        dead_letter=outboxkit_topic(prefix="dlq"),
        consumer_options=ONE_BY_ONE,
    )
    assert behaviour.started.wait(60), "the handler never ran"
    with psycopg.connect(outboxkit_db_url) as locker:  # an operator's report, say
        locker.execute(
            "SELECT 1 FROM outboxkit.inbox_message WHERE event_id = %s FOR UPDATE", [event_id]
        )
        behaviour.go.set()
        mark = "wait_event_type = 'Lock' AND query LIKE '%%SET state = ''succeeded''%%'"
        wait_for(lambda: _signal(admin, "pg_cancel_backend", mark), what="the mark cancelled")
        locker.rollback()
    harness.wait_outcomes(event_id)
    _succeeded_once(outboxkit_db_url, event_id, behaviour)


def test_a_terminated_handler_session_is_no_attempt(
    start: Start,  # noqa: F811
    admin: psycopg.Connection[tuple[object, ...]],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
) -> None:
    topic, event_id, behaviour = outboxkit_topic(), str(uuid.uuid4()), HeldOnce()
    produce_event(outboxkit_kafka_bootstrap, topic, event_id, "o-1", 1)
    harness = start(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=1),
        dead_letter=outboxkit_topic(prefix="dlq"),
        consumer_options=ONE_BY_ONE,
    )
    assert behaviour.started.wait(60), "the handler never ran"
    handler = "state = 'idle in transaction' AND query LIKE 'INSERT INTO public.effect%%'"
    wait_for(lambda: _signal(admin, "pg_terminate_backend", handler), what="handler's session")
    behaviour.go.set()
    harness.wait_outcomes(event_id)
    _succeeded_once(outboxkit_db_url, event_id, behaviour)
