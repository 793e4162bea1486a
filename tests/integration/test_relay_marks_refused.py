"""A relay whose database marks keep failing while Kafka takes its sends, in at_least_once mode:
the marks alone refused (a trigger), or UPDATE on the outbox revoked from its role (then its
scheduling pass fails first, before any send). It must back off as any failure does, its lines
stay limited (a Kafka send whose rows are never marked is not "working again"), and what it
sent is not sent again term after term: each new term first marks the rows Kafka took and the
last term could not mark, and sends nothing while that fails. Once the grant is back, every row
is published and marked.

Before, each term's first send counted as working again: the back-off restarted from
``backoff_initial`` every time (a loop every 0.2-0.4 s) and every retry logged its error and a
"working again" line. Later, with the back-off right, each term still sent its claim and the
next one again: duplicates grew with every failed term (two claims a term)."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from outboxkit.relay.retry_log import SHOWN_IN_FULL
from outboxkit.settings import Settings
from tests.relay_support import (
    KAFKA_CLIENTS,
    cli_ok,
    consume,
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

ROWS = 200
CLAIM = 10  # rows per claim and per Kafka transaction
TERMS = SHOWN_IN_FULL + 3  # failed terms watched: beyond those whose lines are all shown
BACKOFF_MAX = 0.8


@pytest.fixture
def relay_role(outboxkit_db_url: str) -> Iterator[tuple[str, str]]:
    """The URL and name of a LOGIN role with the relay's grants only: REVOKE does not bite on
    the superuser the other tests use."""
    name = f"ok_relay_{uuid.uuid4().hex[:8]}"
    password = uuid.uuid4().hex
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    cli_ok(outboxkit_db_url, "migrate", "grants", "--relay", name, "--apply")
    parts = urlsplit(outboxkit_db_url)
    host = parts.netloc.rpartition("@")[2]
    try:
        yield urlunsplit(parts._replace(netloc=f"{name}:{password}@{host}")), name
    finally:
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {name}")
            conn.execute(f"DROP ROLE {name}")


# Only the marks refused (the relay's other writes, such as its scheduling pass, go through):
# what a trigger of the application's, or a statement_timeout shorter than the mark, does.
REFUSE_MARKS = """
CREATE FUNCTION outboxkit.test_refuse_marks() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'published' THEN
        RAISE EXCEPTION 'marks refused by the test' USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_refuse_marks BEFORE UPDATE ON outboxkit.outbox_message
    FOR EACH ROW EXECUTE FUNCTION outboxkit.test_refuse_marks();
"""
ALLOW_MARKS = "DROP FUNCTION outboxkit.test_refuse_marks() CASCADE"
WAYS = ["update_revoked", "marks_refused"]


def _update(db_url: str, role: str, way: str, *, allowed: bool) -> None:
    if way == "marks_refused":
        statement = ALLOW_MARKS if allowed else REFUSE_MARKS
    else:
        statement = "GRANT UPDATE ON {} TO {}" if allowed else "REVOKE UPDATE ON {} FROM {}"
        statement = statement.format("outboxkit.outbox_message", role)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(statement)


def _settings(url: str, bootstrap: str, client: str | None) -> Settings:
    """at_least_once, claims and transactions of CLAIM rows, a short back-off."""
    return relay_settings(
        url,
        bootstrap,
        client=client,
        mode="at_least_once",
        batch_size=CLAIM,
        max_batch_size=CLAIM,
        transaction_max_rows=CLAIM,
        backoff_initial=0.2,
        backoff_max=BACKOFF_MAX,
    )


def _terms(records: list[logging.LogRecord]) -> int:
    """Terms ended (each releases its lease: logged at DEBUG while a streak goes on)."""
    return sum("released lease of shard 0" in r.getMessage() for r in records)


def _lines(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if r.levelno >= logging.INFO]


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_refused_marks_back_off_and_the_rows_are_marked_once_granted(
    client: str,
    way: str,
    relay_role: tuple[str, str],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, role = relay_role
    topic = outboxkit_topic()  # type: ignore[operator]
    expected = payloads("k", ROWS)
    insert_rows(outboxkit_db_url, topic, expected)
    _update(outboxkit_db_url, role, way, allowed=False)
    settings = _settings(url, outboxkit_kafka_bootstrap, client)
    caplog.set_level(logging.INFO, logger="outboxkit")
    caplog.set_level(logging.DEBUG, logger="outboxkit.relay.connections")
    async with running_relay(settings):
        await wait_for_async(
            lambda: _terms(caplog.records) >= TERMS, within=120, what="failed terms"
        )
        records = list(caplog.records)
        caplog.clear()
        _update(outboxkit_db_url, role, way, allowed=True)
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": ROWS}, what="all marked"
        )
        after = list(caplog.records)
    during = _lines(records)
    retries = [m for m in during if "InsufficientPrivilege" in m and "retrying in" in m]
    assert not [m for m in during if "working again" in m]
    # In full for the first retries, then the first of a kind; the rest only counted.
    assert SHOWN_IN_FULL <= len(retries) <= SHOWN_IN_FULL + 1, retries
    delays = [float(re.findall(r"retrying in ([\d.]+)s", m)[0]) for m in retries]
    # The back-off doubles from 0.2 s to its maximum (full jitter: at least half of it).
    assert all(BACKOFF_MAX / 2 <= d <= BACKOFF_MAX for d in delays[3:]), delays
    assert len(during) <= 2 * TERMS, during
    assert len([m for m in _lines(after) if "working again" in m]) == 1, _lines(after)
    received = consume(outboxkit_kafka_bootstrap, topic, expect=ROWS)
    assert {r.value for r in received} == {v for _, v in expected}
    # The first term sends its claim and the next one before the refused mark ends it; both
    # claims' marks are owed, made before anything more is sent: nothing went twice, whatever
    # the number of failed terms.
    assert _terms(records) >= TERMS
    assert len(received) == ROWS, len(received) - ROWS
    assert received[-1].value == expected[-1][1]  # the key's last record: its newest row


async def test_a_shard_that_had_another_holder_meanwhile_sends_what_it_owed_again(
    relay_role: tuple[str, str],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: object,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What a shard owes is its process's: a term ended on a refused mark releases the lease at
    once, and a standby takes the shard during the back-off, claims those rows again and sends
    them (maybe only some, should Kafka refuse a part and its term end before it retries). Back
    with the lease, the first process must not mark them unsent: an older record of a key could
    stay the last one of its partition. It drops them (its lease shows the other holder) and
    they go with the claims: as many duplicates as holder changes allow, nothing lost, and the
    last record of the key is its newest row."""
    url, role = relay_role
    topic = outboxkit_topic()  # type: ignore[operator]
    expected = payloads("k", ROWS)
    insert_rows(outboxkit_db_url, topic, expected)
    _update(outboxkit_db_url, role, "marks_refused", allowed=False)
    settings = _settings(url, outboxkit_kafka_bootstrap, None)
    caplog.set_level(logging.DEBUG, logger="outboxkit.relay.connections")
    caplog.set_level(logging.INFO, logger="outboxkit.relay.shard_worker")
    async with running_relay(settings, holder="a"), running_relay(settings, holder="b"):
        await wait_for_async(
            lambda: _terms(caplog.records) >= TERMS and bool(_dropped(caplog.records)),
            within=120,
            what="failed terms, and a process back with the lease after the other",
        )
        _update(outboxkit_db_url, role, "marks_refused", allowed=True)
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": ROWS}, what="all marked"
        )
    received = consume(outboxkit_kafka_bootstrap, topic, expect=ROWS)
    assert {r.value for r in received} == {v for _, v in expected}
    assert received[-1].value == expected[-1][1]  # the key's last record: its newest row


def _dropped(records: list[logging.LogRecord]) -> list[str]:
    return [r.getMessage() for r in records if "another holder had it since" in r.getMessage()]
