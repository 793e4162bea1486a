"""A database whose default ``client_encoding`` is not UTF8 (``ALTER DATABASE .. SET
client_encoding = 'LATIN1'``, as older installations have it; ``ALTER ROLE`` and
``PGCLIENTENCODING`` do the same), holding text that encoding lacks.

Before, our own connections took the database's default: the server refused to send such a row,
so a relay's claim failed on it at every try and its shard stalled behind it, and the operator
commands failed on it. Every connection and engine of ours now asks for UTF8 at start-up. On
the application's own connection, which stays in the application's encoding, the writer refuses
to write at all unless that encoding is UTF8, with a ``ConfigurationError`` that says why (it
refused only a value the encoding could not carry, with psycopg's ``UnicodeEncodeError`` before
that; other encodings than LATIN1 changed text on its way: ``test_writes_encodings``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from outboxkit import db
from outboxkit.db.engines import async_engine, sync_engine
from outboxkit.errors import ConfigurationError
from outboxkit.events import Event, Message
from outboxkit.inbox import InboxSettings
from outboxkit.outbox import Outbox, OutboxConfig
from tests.integration.inbox_support import (
    EFFECT_DDL,
    REGISTRY,
    Behaviour,
    Harness,
    headers_for,
    payload,
    produce,
)
from tests.relay_support import (
    KAFKA_CLIENTS,
    cli_ok,
    consume,
    insert_rows,
    relay_settings,
    row_states,
    running_relay,
    set_shard_count,
)
from tests.support.db_names import database_of
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]
KEY = "kunde-日本"  # no LATIN1 character for 日本
HEADERS = {"region": "東京", "note": "naïve"}  # the second one LATIN1 has


@pytest.fixture
def latin1_db_url(outboxkit_db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test's database with LATIN1 as its default client encoding, checked to refuse a row
    of UTF8-only text to a connection that asks for nothing (and none is asked for here)."""
    monkeypatch.delenv("PGCLIENTENCODING", raising=False)
    monkeypatch.delenv("PGOPTIONS", raising=False)
    database = database_of(outboxkit_db_url)
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET client_encoding = 'LATIN1'").format(
                sql.Identifier(database)
            )
        )
    with (
        psycopg.connect(outboxkit_db_url) as conn,
        pytest.raises(psycopg.errors.UntranslatableCharacter),
    ):
        conn.execute("SELECT convert_from('\\xe697a5'::bytea, 'UTF8')").fetchone()
    return outboxkit_db_url


def _utf8(db_url: str) -> psycopg.Connection:
    return psycopg.connect(db_url, autocommit=True, client_encoding="UTF8")


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_the_relay_publishes_text_the_databases_default_encoding_lacks(
    latin1_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory, client: str
) -> None:
    set_shard_count(latin1_db_url, 1)
    topic = outboxkit_topic()
    rows = [(KEY, b'{"n": 1}'), ("plain", b'{"n": 2}'), (KEY, b'{"n": 3}')]
    with _utf8(latin1_db_url) as conn:  # as an application writing in UTF8 stores it
        insert_rows(conn, topic, rows, headers=HEADERS, event_type="bestellung.erstellt.日本")
    settings = relay_settings(latin1_db_url, outboxkit_kafka_bootstrap, client=client)
    async with running_relay(settings):
        await wait_for_async(
            lambda: row_states(latin1_db_url) == {"published": 3}, what="all three published"
        )
    got = consume(outboxkit_kafka_bootstrap, topic, expect=3)
    assert [(r.key, r.value) for r in got] == rows
    for record in got:
        assert {k: record.headers[k] for k in HEADERS} == HEADERS
        assert record.headers["event-type"] == "bestellung.erstellt.日本"


def test_operator_commands_show_text_the_databases_default_encoding_lacks(
    latin1_db_url: str,
) -> None:
    with _utf8(latin1_db_url) as conn:
        [row_id] = insert_rows(conn, "t", [(KEY, b"{}")])
        conn.execute(
            "UPDATE outboxkit.outbox_message SET state = 'parked', parked_reason = %s,"
            " parked_at = now() WHERE id = %s",
            ("refused: 日本", row_id),
        )
    [item] = json.loads(cli_ok(latin1_db_url, "outbox", "parked", "--json"))
    assert (item["key"], item["reason"]) == (KEY, "refused: 日本")
    event = "ereignis-日本"
    cli_ok(latin1_db_url, "inbox", "cancel", "--consumer", "c", "--event-id", event,
           "--before-delivery")  # fmt: skip
    assert event in cli_ok(latin1_db_url, "inbox", "show", "--consumer", "c")
    assert "cancelled" in cli_ok(latin1_db_url, "inbox", "show", "--consumer", "c",
                                 "--event-id", event)  # fmt: skip


@pytest.fixture(params=["database default", "PGCLIENTENCODING"])
def other_encoding_url(
    request: pytest.FixtureRequest,
    latin1_db_url: str,
    outboxkit_db_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    if request.param == "PGCLIENTENCODING":
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} RESET client_encoding").format(
                sql.Identifier(database_of(outboxkit_db_url))))  # fmt: skip
        monkeypatch.setenv("PGCLIENTENCODING", "LATIN1")
        with psycopg.connect(outboxkit_db_url) as conn:
            assert conn.info.parameter_status("client_encoding") == "LATIN1"
    return latin1_db_url


async def test_every_connection_and_engine_of_ours_asks_for_utf8(
    other_encoding_url: str,
) -> None:
    show = "SHOW client_encoding"
    with db.connect(other_encoding_url) as conn:
        assert conn.execute(show).fetchone() == ("UTF8",)
    async with db.connection_async(other_encoding_url) as aconn:
        assert await (await aconn.execute(show)).fetchone() == ("UTF8",)
    engine = sync_engine(other_encoding_url)  # inbox run's, the inbox commands'
    try:
        with engine.connect() as sconn:
            assert sconn.exec_driver_sql(show).scalar() == "UTF8"
    finally:
        engine.dispose()
    aengine = async_engine(other_encoding_url)
    try:
        async with aengine.connect() as saconn:
            assert (await saconn.exec_driver_sql(show)).scalar() == "UTF8"
    finally:
        await aengine.dispose()


def _messages(count: int) -> list[Message]:
    return [Message("t", {"n": n}, key=KEY if n == count - 1 else "k") for n in range(count)]


def _write(outbox: Outbox, conn: sa.Connection, count: int) -> object:
    """``add`` for one message, ``add_many`` (its INSERT, or its COPY from 100) for more."""
    if count == 1:
        return outbox.add(conn, _messages(1)[0])
    return outbox.add_many(conn, _messages(count))


async def _write_async(outbox: Outbox, conn: AsyncConnection, count: int) -> object:
    if count == 1:
        return await outbox.add_async(conn, _messages(1)[0])
    return await outbox.add_many_async(conn, _messages(count))


def _refused(error: ConfigurationError) -> None:
    text = str(error)
    assert "client_encoding is LATIN1" in text, text
    assert "needs UTF8" in text, text
    assert "日本" not in text, text


@pytest.mark.parametrize("count", [1, 3, 150], ids=["one", "insert", "copy"])
def test_the_writer_refuses_a_session_not_in_utf8(latin1_db_url: str, count: int) -> None:
    """On the application's connection (LATIN1 here): a clear error whatever the text (it was
    only for text LATIN1 lacks, and text LATIN1 has was written), nothing written, and the
    caller's transaction still usable (nothing was sent). Asking for UTF8 is the remedy."""
    outbox = Outbox(OutboxConfig(copy_min_rows=100))
    url = latin1_db_url.replace("postgresql://", "postgresql+psycopg://")
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            with pytest.raises(ConfigurationError) as refused:
                _write(outbox, conn, count)
            _refused(refused.value)
            assert conn.execute(sa.text("SELECT 1")).scalar() == 1
            with pytest.raises(ConfigurationError):
                outbox.add(conn, Message("t", {"n": 0}, key="naïve"))
    finally:
        engine.dispose()
    assert row_states(latin1_db_url) == {}
    engine = sa.create_engine(url, connect_args={"client_encoding": "UTF8"})
    try:
        with engine.begin() as conn:
            _write(outbox, conn, count)
    finally:
        engine.dispose()
    assert row_states(latin1_db_url) == {"pending": count}


@pytest.mark.parametrize("count", [1, 3, 150], ids=["one", "insert", "copy"])
async def test_the_async_writer_refuses_a_session_not_in_utf8(
    latin1_db_url: str, count: int
) -> None:
    outbox = Outbox(OutboxConfig(copy_min_rows=100))
    engine = create_async_engine(latin1_db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        async with engine.begin() as conn:
            with pytest.raises(ConfigurationError) as refused:
                await _write_async(outbox, conn, count)
            _refused(refused.value)
            assert (await conn.execute(sa.text("SELECT 1"))).scalar() == 1
    finally:
        await engine.dispose()
    assert row_states(latin1_db_url) == {}


@pytest.mark.parametrize("adapter", ["confluent", "aiokafka"])
def test_a_consumer_on_a_latin1_engine_gives_up_what_it_cannot_send_and_goes_on(
    latin1_db_url: str, outboxkit_kafka_bootstrap: str, outboxkit_topic: TopicFactory, adapter: str
) -> None:
    """The application's engine keeps the database's LATIN1: a record whose event id, or whose
    event type, that encoding lacks fails its statements, is given up after
    ``max_unexpected_errors`` (recorded under a hash of its id, without the event type), and
    the record behind it runs. Before, a bad event type failed the rejection too (it was sent
    again with the hashed id), and the partition waited on that record for good."""
    with _utf8(latin1_db_url) as conn:
        conn.execute(EFFECT_DDL)
    topic, bad_type, good = outboxkit_topic(), str(uuid.uuid4()), str(uuid.uuid4())
    produce(
        outboxkit_kafka_bootstrap,
        topic,
        [
            (b"k", payload("o-1", 1), headers_for("zahlung-日本")),
            (b"k", payload("o-2", 2), headers_for(bad_type, event_type="zahlung.日本")),
            (b"k", payload("o-3", 3), headers_for(good)),
        ],
    )
    harness = Harness(
        adapter,
        sa_url=db.sqlalchemy_url(latin1_db_url),
        bootstrap=outboxkit_kafka_bootstrap,
        topics=[topic],
        settings=InboxSettings(consumer="billing", registry=REGISTRY),
        behaviour=Behaviour(),
        consumer_options={"max_unexpected_errors": 2},
    ).start()
    try:
        harness.wait_outcomes(good)
    finally:
        harness.stop()
    with _utf8(latin1_db_url) as conn:
        rejected = conn.execute(
            "SELECT event_id, event_type, reason FROM outboxkit.inbox_rejection"
            " ORDER BY kafka_offset"
        ).fetchall()
        applied = conn.execute("SELECT event_id FROM public.effect").fetchall()
    assert [(event_id[:7], event_type) for event_id, event_type, _ in rejected] == [
        ("sha256:", None),
        ("sha256:", None),
    ]
    for *_, reason in rejected:
        assert reason.startswith("gave up after 2 unexpected errors"), reason
        assert "client_encoding (LATIN1)" in reason, reason
    assert applied == [(good,)]


class Shipped(Event, topic="t", event_type="shipped"):
    n: int

    def outbox_key(self) -> str | None:
        if self.n == 120:  # the application's own code failing while the COPY streams
            raise UnicodeEncodeError("ascii", "ü", 0, 1, "a key of the application's own")
        return str(self.n)


def test_the_applications_own_encode_error_during_a_copy_is_its_own(outboxkit_db_url: str) -> None:
    """Only what psycopg could not send becomes the ConfigurationError: an error of the items
    themselves, raised while the COPY streams, reaches the caller unchanged (a UTF8 session)."""
    engine = sa.create_engine(db.sqlalchemy_url(outboxkit_db_url))
    try:
        with engine.begin() as conn, pytest.raises(UnicodeEncodeError, match="own"):
            Outbox(OutboxConfig(copy_min_rows=100)).add_many(
                conn, [Shipped(n=n) for n in range(150)]
            )
    finally:
        engine.dispose()
    assert row_states(outboxkit_db_url) == {}
