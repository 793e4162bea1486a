"""A privilege revoked from the consumer's role while it runs (``REVOKE UPDATE ON
outboxkit.inbox_message``: the claim is an upsert, which needs UPDATE even for a new row) is an
operator's problem, not the record's: the refused claims are retried like an outage, with a
rate-limited line that says which command prints the grants, and once the grant is back every
event is applied once. Before, each refusal counted against the record, which was given up after
``max_unexpected_errors``: recorded in ``inbox_rejection``, its offset committed, its effect
never applied."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from outboxkit import db
from outboxkit.db import grants
from outboxkit.inbox import OutcomeKind
from tests.integration.inbox_support import (
    EFFECT_DDL,
    Harness,
    effects,
    fetch,
    produce_event,
    wait_refused_again_and_again,
)
from tests.integration.test_inbox_conformance import adapter, start  # noqa: F401

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
Start = Callable[..., Harness]
GIVE_UP_AFTER = 2  # max_unexpected_errors: the old code gave a record up after this many


@pytest.fixture
def consumer_role(outboxkit_db_url: str) -> Iterator[str]:
    """A LOGIN role with exactly the consumer's grants (``migrate grants --consumer``) and the
    handler's on ``public.effect``; its name."""
    name = f"ok_cons_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'").format(sql.Identifier(name)))
        conn.execute(EFFECT_DDL)
        grants.apply(conn, "outboxkit", {"consumer": name})
        role = sql.Identifier(name)
        conn.execute(sql.SQL("GRANT SELECT, INSERT ON public.effect TO {}").format(role))
        conn.execute(sql.SQL("GRANT USAGE ON SEQUENCE public.effect_id_seq TO {}").format(role))
    try:
        yield name
    finally:
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def sa_url(outboxkit_db_url: str, consumer_role: str) -> str:
    """The harness (``start``) connects as the least-privilege consumer role."""
    parts = urlsplit(outboxkit_db_url)
    host = parts.netloc.rpartition("@")[2]
    return db.sqlalchemy_url(urlunsplit(parts._replace(netloc=f"{consumer_role}:pw@{host}")))


def _privilege(db_url: str, statement: str, role: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL(statement).format(sql.Identifier(role)))


def _refusals(harness: Harness) -> int:
    """Deliveries retried after an error outside the handler (no event settled)."""
    return sum(1 for o in list(harness.outcomes) if o.kind is OutcomeKind.RETRY and not o.event_id)


def test_a_revoked_update_grant_holds_events_until_it_is_back(
    start: Start,  # noqa: F811
    consumer_role: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = outboxkit_topic()
    harness = start([topic], consumer_options={"max_unexpected_errors": GIVE_UP_AFTER})
    first = str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, first, "o-first", 1)
    harness.wait_outcomes(first)

    _privilege(outboxkit_db_url, "REVOKE UPDATE ON outboxkit.inbox_message FROM {}", consumer_role)
    during = [str(uuid.uuid4()) for _ in range(3)]
    try:
        for n, event_id in enumerate(during):
            produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o-during-{n}", n)
        wait_refused_again_and_again(harness, GIVE_UP_AFTER)
    finally:
        _privilege(outboxkit_db_url, "GRANT UPDATE ON outboxkit.inbox_message TO {}", consumer_role)
    after = str(uuid.uuid4())
    produce_event(outboxkit_kafka_bootstrap, topic, after, "o-after", 9)
    ids = [first, *during, after]
    harness.wait_outcomes(*ids)

    assert not fetch(outboxkit_db_url, "SELECT reason FROM outboxkit.inbox_rejection")
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted(ids)  # each once
    states = fetch(outboxkit_db_url, "SELECT state, attempts FROM outboxkit.inbox_message")
    assert sorted(states) == [("succeeded", 1)] * len(ids)
    refused = [r for r in caplog.records if "permission denied" in r.getMessage()]
    assert refused, caplog.text
    assert "outboxkit migrate grants --consumer" in refused[0].getMessage()
    # Rate-limited like an outage: the first line of its kind, not one per retry.
    assert len(refused) < _refusals(harness), [r.getMessage() for r in refused]
    assert "gave up" not in caplog.text
