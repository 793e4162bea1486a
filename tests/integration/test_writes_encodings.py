"""The writer and text encodings, on every path (add; add_many's INSERT; its COPY), sync and
async, against the real PostgreSQL.

- A caller's session whose ``client_encoding`` is not UTF8 is refused before anything is sent.
  Before, SJIS broke COPY's escapes (key ``表n`` stored as ``表`` and a newline) and EUC_JP or
  SJIS merged different idempotency keys (``¥`` arrived as a backslash: the second event was
  reported a duplicate and never written).
- Text a LATIN1 database lacks is a ``ConfigurationError`` naming that encoding, not the
  driver's ``DataError`` quoting the character's bytes; add_many's savepoint still takes its
  rows back.
- A ``deliver_after`` whose offset PostgreSQL's text form cannot hold (beyond +-15:59, or
  with fractional seconds) is stored by the COPY path as by the INSERT path; before, the COPY
  failed with a ``DataError`` quoting the value.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outboxkit.db import migrator, sqlalchemy_url
from outboxkit.devstack.postgres import database_url_with
from outboxkit.errors import ConfigurationError
from outboxkit.events import Message
from outboxkit.outbox import Outbox, OutboxConfig
from tests.relay_support import row_states
from tests.support.db_names import database_of

pytestmark = pytest.mark.integration

OUTBOX = Outbox(OutboxConfig(copy_min_rows=100))
PATHS = {"one": 1, "insert": 3, "copy": 150}  # add; add_many below and above copy_min_rows
OFFSETS = {
    "+20:00": timedelta(hours=20),
    "-16:30": -timedelta(hours=16, minutes=30),
    "+01:00:00.5": timedelta(hours=1, microseconds=500_000),
}
LACKING = {  # text LATIN1 lacks, in each field that holds text
    "key": {"key": "5€"},
    "idempotency_key": {"idempotency_key": "日本-1"},
    "header": {"headers": {"region": "東京"}},
    "event_type": {"event_type": "zahlung.日本"},
}


def _messages(count: int, **last: Any) -> list[Message]:
    """``count`` messages; the last one with ``last``'s fields."""
    items = [Message("t", {"n": n}, key="k", idempotency_key=f"i-{n}") for n in range(count - 1)]
    return [*items, Message("t", {"n": count}, **{"idempotency_key": "last", **last})]


def _write(target: Session | sa.Connection, count: int, **last: Any) -> None:
    if count == 1:
        OUTBOX.add(target, _messages(1, **last)[0])
    else:
        OUTBOX.add_many(target, _messages(count, **last))


async def _write_async(target: AsyncSession | AsyncConnection, count: int, **last: Any) -> None:
    if count == 1:
        await OUTBOX.add_async(target, _messages(1, **last)[0])
    else:
        await OUTBOX.add_many_async(target, _messages(count, **last))


# -- a caller's session not in UTF8 -------------------------------------------------------------


def _not_utf8_told(error: ConfigurationError, encoding: str) -> None:
    text = str(error)
    assert f"client_encoding is {encoding}" in text, text
    assert "connect_args={'client_encoding': 'UTF8'}" in text, text


@pytest.mark.parametrize("encoding", ["SJIS", "EUC_JP", "LATIN1"])
@pytest.mark.parametrize("count", PATHS.values(), ids=PATHS)
@pytest.mark.parametrize("on", ["connection", "session"])
def test_a_session_not_in_utf8_is_refused_before_anything_is_sent(
    sa_url: str, outboxkit_db_url: str, encoding: str, count: int, on: str
) -> None:
    """Whatever the text (plain ASCII here): nothing is sent, the transaction goes on."""
    engine = sa.create_engine(sa_url, connect_args={"client_encoding": encoding})
    try:
        with engine.connect() as conn:
            target = conn if on == "connection" else Session(bind=conn)
            with pytest.raises(ConfigurationError) as refused:
                _write(target, count)
            _not_utf8_told(refused.value, encoding)
            conn.execute(sa.text("CREATE TABLE after_refusal (n int)"))  # still usable
            conn.commit()
    finally:
        engine.dispose()
    assert row_states(outboxkit_db_url) == {}


@pytest.mark.parametrize("encoding", ["SJIS", "EUC_JP"])
@pytest.mark.parametrize("count", PATHS.values(), ids=PATHS)
@pytest.mark.parametrize("on", ["connection", "session"])
async def test_an_async_session_not_in_utf8_is_refused_before_anything_is_sent(
    sa_url: str, outboxkit_db_url: str, encoding: str, count: int, on: str
) -> None:
    engine = create_async_engine(sa_url, connect_args={"client_encoding": encoding})
    try:
        async with engine.connect() as conn:
            target = conn if on == "connection" else AsyncSession(bind=conn)
            with pytest.raises(ConfigurationError) as refused:
                await _write_async(target, count)
            _not_utf8_told(refused.value, encoding)
            await conn.execute(sa.text("CREATE TABLE after_refusal (n int)"))
            await conn.commit()
    finally:
        await engine.dispose()
    assert row_states(outboxkit_db_url) == {}


@pytest.mark.parametrize("count", PATHS.values(), ids=PATHS)
def test_a_database_defaulting_to_sjis_is_written_intact_on_a_utf8_session(
    sa_url: str, outboxkit_db_url: str, count: int
) -> None:
    """The remedy the refusal names: the keys arrive as sent, and two keys stay two."""
    with psycopg.connect(outboxkit_db_url, autocommit=True) as admin:
        database = database_of(outboxkit_db_url)
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET client_encoding = 'SJIS'").format(
                sql.Identifier(database)
            )
        )
    engine = sa.create_engine(sa_url, connect_args={"client_encoding": "UTF8"})
    try:
        with engine.begin() as conn:
            _write(conn, count, key="表n", idempotency_key="charge-¥")
        with engine.begin() as conn:
            assert not OUTBOX.add(conn, Message("t", {}, idempotency_key="charge-\\")).duplicate
            stored = conn.execute(
                sa.text(
                    "SELECT idempotency_key, message_key FROM outboxkit.outbox_message"
                    " WHERE idempotency_key LIKE 'charge-%' ORDER BY id"
                )
            ).all()
    finally:
        engine.dispose()
    assert [tuple(row) for row in stored] == [("charge-¥", "表n"), ("charge-\\", None)]


# -- text the database's encoding lacks ----------------------------------------------------------


@pytest.fixture(scope="module")
def latin1_url(outboxkit_database_url: str) -> Iterator[str]:
    """A migrated database in LATIN1 (every test here rolls its writes back)."""
    name = f"outboxkit_latin1_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(outboxkit_database_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL(
                "CREATE DATABASE {} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C'"
                " TEMPLATE template0"
            ).format(sql.Identifier(name))
        )
    url = database_url_with(outboxkit_database_url, name)
    migrator.upgrade(url)
    try:
        yield sqlalchemy_url(url)
    finally:
        with psycopg.connect(outboxkit_database_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _lacking_told(error: ConfigurationError) -> None:
    """Named the encoding; quoted neither the text nor its bytes, nor chained the error that
    does."""
    text = str(error)
    assert "the database's encoding (LATIN1) lacks" in text, text
    for quoted in ("€", "日本", "東京", "0xe2", "0xe6"):
        assert quoted not in text, text
    assert error.__cause__ is None
    assert error.__context__ is None


def _after_refusal(conn: sa.Connection, count: int) -> None:
    """add_many's savepoint takes its rows back and the transaction goes on; add has none."""
    if count == 1:
        with pytest.raises(sa.exc.InternalError, match="InFailedSqlTransaction"):
            conn.execute(sa.text("SELECT 1"))
        return
    assert not OUTBOX.add(conn, Message("t", {}, key="café", idempotency_key="after")).duplicate
    assert conn.execute(sa.text("SELECT count(*) FROM outboxkit.outbox_message")).scalar() == 1


@pytest.mark.parametrize("field", LACKING)
@pytest.mark.parametrize("count", PATHS.values(), ids=PATHS)
def test_text_the_database_lacks_is_a_configuration_error(
    latin1_url: str, field: str, count: int
) -> None:
    engine = sa.create_engine(latin1_url, connect_args={"client_encoding": "UTF8"})
    try:
        with engine.connect() as conn:
            with pytest.raises(ConfigurationError) as refused:
                _write(conn, count, **LACKING[field])
            _lacking_told(refused.value)
            _after_refusal(conn, count)
            conn.rollback()
    finally:
        engine.dispose()


@pytest.mark.parametrize("field", ["key", "header"])
@pytest.mark.parametrize("count", PATHS.values(), ids=PATHS)
async def test_text_the_database_lacks_is_a_configuration_error_async(
    latin1_url: str, field: str, count: int
) -> None:
    engine = create_async_engine(latin1_url, connect_args={"client_encoding": "UTF8"})
    try:
        async with engine.connect() as conn:
            with pytest.raises(ConfigurationError) as refused:
                await _write_async(conn, count, **LACKING[field])
            _lacking_told(refused.value)
            await conn.run_sync(_after_refusal, count)
            await conn.rollback()
    finally:
        await engine.dispose()


def test_text_the_database_has_is_written(latin1_url: str) -> None:
    engine = sa.create_engine(latin1_url, connect_args={"client_encoding": "UTF8"})
    try:
        with engine.connect() as conn:
            _write(conn, PATHS["copy"], key="café", headers={"note": "naïve"})
            stored = conn.execute(
                sa.text(
                    "SELECT message_key, headers->>'note' FROM outboxkit.outbox_message"
                    " WHERE idempotency_key = 'last'"
                )
            ).one()
            conn.rollback()
    finally:
        engine.dispose()
    assert tuple(stored) == ("café", "naïve")


# -- deliver_after offsets -----------------------------------------------------------------------

_STORED = "SELECT deliver_after FROM outboxkit.outbox_message WHERE deliver_after IS NOT NULL"


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("count", PATHS.values(), ids=PATHS)
def test_deliver_after_with_any_offset_is_stored_on_every_path(
    engine: sa.Engine, offset: str, count: int
) -> None:
    when = datetime(2030, 1, 1, tzinfo=timezone(OFFSETS[offset]))
    with engine.begin() as conn:
        _write(conn, count, deliver_after=when)
    with engine.connect() as conn:
        stored = conn.execute(sa.text(_STORED)).scalars().all()
    assert stored == [when]  # the same instant (aware datetimes compare as instants)


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("count", [PATHS["one"], PATHS["copy"]], ids=["one", "copy"])
async def test_deliver_after_with_any_offset_is_stored_on_every_path_async(
    sa_url: str, offset: str, count: int
) -> None:
    when = datetime(2030, 1, 1, tzinfo=timezone(OFFSETS[offset]))
    engine = create_async_engine(sa_url)
    try:
        async with engine.begin() as conn:
            await _write_async(conn, count, deliver_after=when)
        async with engine.connect() as conn:
            stored = (await conn.execute(sa.text(_STORED))).scalars().all()
    finally:
        await engine.dispose()
    assert stored == [when]
