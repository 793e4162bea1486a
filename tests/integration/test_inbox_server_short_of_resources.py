"""The server short of a resource every session shares, on the middleware's own statements: its
lock table ("out of shared memory", 53200) or ``temp_file_limit`` (53400). Found against a real
server with a full lock table: each claim failed, the failures counted against the record, and
after ``max_unexpected_errors`` the record was given up (``inbox_rejection``), its offset
committed, its effect never applied. They are the server's state now, retried like an outage.

The errors come from a trigger on the inbox table (a full lock table is not something a test can
make for the claim alone, or without stopping every other session's work).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest

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

SHORT_OF = """
CREATE TABLE public.short_of (sqlstate text NOT NULL, message text NOT NULL);
CREATE FUNCTION public.short_of_resources() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted record;
BEGIN
    SELECT * INTO wanted FROM public.short_of LIMIT 1;
    IF wanted.sqlstate IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = wanted.sqlstate, MESSAGE = wanted.message;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER short_of_resources BEFORE INSERT OR UPDATE ON outboxkit.inbox_message
    FOR EACH ROW EXECUTE FUNCTION public.short_of_resources();
"""


@pytest.fixture
def short_of(outboxkit_db_url: str) -> Iterator[Callable[[str | None, str], None]]:
    """``short_of(sqlstate, message)``: every inbox write fails so; ``short_of(None, "")``:
    none does."""
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(EFFECT_DDL)
        conn.execute(SHORT_OF)

    def set_state(sqlstate: str | None, message: str) -> None:
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute("DELETE FROM public.short_of")
            if sqlstate is not None:
                conn.execute("INSERT INTO public.short_of VALUES (%s, %s)", (sqlstate, message))

    yield set_state
    set_state(None, "")


@pytest.mark.parametrize(
    ("sqlstate", "message"),
    [
        ("53200", "out of shared memory"),
        ("53400", "temporary file size exceeds temp_file_limit (1024kB)"),
    ],
    ids=["lock-table-full", "temp-file-limit"],
)
def test_a_server_short_of_a_shared_resource_holds_events_until_it_is_back(
    start: Start,  # noqa: F811
    short_of: Callable[[str | None, str], None],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    sqlstate: str,
    message: str,
) -> None:
    topic = outboxkit_topic()
    harness = start([topic], consumer_options={"max_unexpected_errors": GIVE_UP_AFTER})
    short_of(sqlstate, message)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    try:
        for n, event_id in enumerate(ids):
            produce_event(outboxkit_kafka_bootstrap, topic, event_id, f"o-{n}", n)
        wait_refused_again_and_again(harness, GIVE_UP_AFTER)
    finally:
        short_of(None, "")
    harness.wait_outcomes(*ids)
    assert not fetch(outboxkit_db_url, "SELECT reason FROM outboxkit.inbox_rejection")
    assert sorted(e[0] for e in effects(outboxkit_db_url)) == sorted(ids)  # each once
    states = fetch(outboxkit_db_url, "SELECT state FROM outboxkit.inbox_message")
    assert states == [("succeeded",)] * len(ids)
