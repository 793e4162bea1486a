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
from sqlalchemy import text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outboxkit.inbox import HandlerContext, RetryPolicy
from outboxkit.inbox.batch_claims import FREE_INTERRUPTIONS
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


def _one_by_one(
    begin: Start,
    bootstrap: str,
    topic_factory: TopicFactory,
    event_id: str,
    behaviour: Behaviour,
    attempts: int = 1,
) -> Harness:
    """One event on a topic of its own, consumed one by one with ``attempts`` at most."""
    topic = topic_factory()
    produce_event(bootstrap, topic, event_id, "o-1", 1)
    return begin(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=attempts, initial_delay=0.05, max_delay=0.05),
        dead_letter=topic_factory(prefix="dlq"),
        consumer_options=ONE_BY_ONE,
    )


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
    event_id, behaviour = str(uuid.uuid4()), HeldOnce()
    harness = _one_by_one(start, outboxkit_kafka_bootstrap, outboxkit_topic, event_id, behaviour)
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
    event_id, behaviour = str(uuid.uuid4()), HeldOnce()
    harness = _one_by_one(start, outboxkit_kafka_bootstrap, outboxkit_topic, event_id, behaviour)
    assert behaviour.started.wait(60), "the handler never ran"
    handler = "state = 'idle in transaction' AND query LIKE 'INSERT INTO public.effect%%'"
    wait_for(lambda: _signal(admin, "pg_terminate_backend", handler), what="handler's session")
    behaviour.go.set()
    harness.wait_outcomes(event_id)
    _succeeded_once(outboxkit_db_url, event_id, behaviour)


class _Orm(DeclarativeBase):
    pass


class _Refused(_Orm):
    """Rows a trigger refuses with SQLSTATE 42501, as a table the consumer's role may not
    write answers: at the INSERT, or (deferred) at the commit."""

    __tablename__ = "refused_row"
    __table_args__ = {"schema": "public"}  # noqa: RUF012
    key: Mapped[str] = mapped_column(primary_key=True)


REFUSING_DDL = """
CREATE TABLE IF NOT EXISTS public.refused_row (key text PRIMARY KEY);
CREATE OR REPLACE FUNCTION public.refuse_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'permission denied for table refused_row' USING ERRCODE = '42501'; END $$;
DROP TRIGGER IF EXISTS refuse_now ON public.refused_row;
DROP TRIGGER IF EXISTS refuse_at_commit ON public.refused_row;
"""
TRIGGERS = {
    "at_flush": "CREATE TRIGGER refuse_now BEFORE INSERT ON public.refused_row"
    " FOR EACH ROW EXECUTE FUNCTION public.refuse_row()",
    "at_commit": "CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON public.refused_row"
    " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.refuse_row()",
}


@pytest.mark.parametrize("when", TRIGGERS)
def test_a_handlers_own_write_refused_counts_one_by_one(
    start: Start,  # noqa: F811
    admin: psycopg.Connection[tuple[object, ...]],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    when: str,
) -> None:
    """The handler only adds an ORM row (no statement of its own): its INSERT goes at the flush
    after the handler, or its deferred trigger at the commit. Refused either way, that is the
    handler's failure, counted: the event ends ``dead`` after its attempts. Before, the flush
    waited for the commit, after the middleware's mark, and the refusal was taken for a grant
    missing on outboxkit's tables: retried for ever, never counted."""
    admin.execute(REFUSING_DDL)
    admin.execute(TRIGGERS[when])
    event_id = str(uuid.uuid4())
    behaviour = Behaviour(add_in={event_id: lambda: _Refused(key=event_id)})
    harness = _one_by_one(
        start, outboxkit_kafka_bootstrap, outboxkit_topic, event_id, behaviour, attempts=2
    )
    harness.wait_outcomes(event_id)
    wait_for(
        lambda: (inbox_row(outboxkit_db_url, "billing", event_id) or {}).get("state") == "dead",
        what="the event dead after its two counted attempts",
    )
    row = inbox_row(outboxkit_db_url, "billing", event_id)
    assert row is not None
    assert row["attempts"] == 2
    assert "42501" in row["last_error"] or "permission denied" in row["last_error"]
    assert effects(outboxkit_db_url, event_id) == []


TERMINATE_OWN_SESSION = text("SELECT pg_terminate_backend(pg_backend_pid())")


@pytest.mark.parametrize("batched", [False, True], ids=["one_by_one", "batched"])
def test_a_run_interrupted_every_time_counts_and_frees_its_partition(
    start: Start,  # noqa: F811
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    batched: bool,
) -> None:
    """The handler's own session is terminated on every run of one event (as a watchdog or a
    pooler's ``query_timeout`` would end it). Its first runs are given back; after
    ``FREE_INTERRUPTIONS`` in a row they count like handler failures, so the event ends
    ``dead`` after its attempts and the event behind it on the same partition succeeds. Before,
    every run was given back: retried for ever, the partition held."""
    topic, doomed, behind = outboxkit_topic(), str(uuid.uuid4()), str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, doomed, "o-1", 1)
    produce_event(outboxkit_kafka_bootstrap, topic, behind, "o-2", 2)
    behaviour = Behaviour(sql={doomed: TERMINATE_OWN_SESSION})
    harness = start(
        [topic],
        behaviour,
        policy=RetryPolicy(max_attempts=2, initial_delay=0.05, max_delay=0.05),
        dead_letter=outboxkit_topic(prefix="dlq"),
        consumer_options={} if batched else ONE_BY_ONE,
    )
    harness.wait_outcomes(doomed, behind)
    row = inbox_row(outboxkit_db_url, "billing", doomed)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("dead", 2), row["last_error"]
    assert f"run interrupted {FREE_INTERRUPTIONS + 2} times" in row["last_error"]
    assert effects(outboxkit_db_url, doomed) == []
    after = inbox_row(outboxkit_db_url, "billing", behind)
    assert after is not None
    assert after["state"] == "succeeded"
    assert len(effects(outboxkit_db_url, behind)) == 1
