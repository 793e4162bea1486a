"""The database seam (``outboxkit.db``) behaves the same on every kind of connection it accepts.

Targets: SQLAlchemy Session, Connection, AsyncSession, AsyncConnection (psycopg underneath), and
plain psycopg Connection / AsyncConnection. Every statement of every area also PREPAREs on the
real server, in the default and in a custom schema.
"""

from __future__ import annotations

import traceback
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outboxkit import db
from outboxkit.db.queries import _BIND_RE, AREAS, Query
from outboxkit.schema import notify_channel

pytestmark = pytest.mark.integration

SA_KINDS = ["sa_session", "sa_connection", "sa_async_session", "sa_async_connection"]
PSYCOPG_KINDS = ["psycopg", "psycopg_async"]
KINDS = SA_KINDS + PSYCOPG_KINDS
SECRET = "s3cret-payload-7f3a"


def q(name: str, area: str = "outbox") -> Query:
    return db.query(area, name, "outboxkit")


@dataclass
class Seam:
    """One target, driven the same way whatever its kind (sync calls made from the test loop)."""

    kind: str
    target: Any

    @property
    def is_async(self) -> bool:
        return "async" in self.kind

    async def run(self, query: Query, params: Mapping[str, Any] | None = None, **kw: Any) -> Any:
        if self.is_async:
            return await db.run_async(self.target, query, params, **kw)
        return db.run(self.target, query, params, **kw)

    async def call(self, name: str, query: Query, params: Mapping[str, Any] | None = None) -> Any:
        """``execute``/``one``/``rows`` (or their ``_async`` twins)."""
        if self.is_async:
            return await getattr(db, f"{name}_async")(self.target, query, params)
        return getattr(db, name)(self.target, query, params)

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        if self.is_async:
            async with db.savepoint_async(self.target):
                yield
        else:
            with db.savepoint(self.target):
                yield

    async def _finish(self, how: str) -> None:
        result = getattr(self.target, how)()
        if self.is_async:
            await result

    async def commit(self) -> None:
        await self._finish("commit")

    async def rollback(self) -> None:
        await self._finish("rollback")


@asynccontextmanager
async def open_seam(kind: str, url: str) -> AsyncIterator[Seam]:
    """A target of ``kind`` on the test database, in a transaction the test ends (or not)."""
    sa_url = db.sqlalchemy_url(url)
    if kind in ("sa_session", "sa_connection"):
        engine = sa.create_engine(sa_url, hide_parameters=False)
        try:
            if kind == "sa_session":
                with Session(engine) as session:
                    yield Seam(kind, session)
            else:
                with engine.connect() as conn:
                    yield Seam(kind, conn)
        finally:
            engine.dispose()
    elif kind in ("sa_async_session", "sa_async_connection"):
        async_engine = create_async_engine(sa_url, hide_parameters=False)
        try:
            if kind == "sa_async_session":
                async with AsyncSession(async_engine) as session:
                    yield Seam(kind, session)
            else:
                async with async_engine.connect() as conn:
                    yield Seam(kind, conn)
        finally:
            await async_engine.dispose()
    elif kind == "psycopg":
        with db.connect(url, autocommit=False) as conn:
            yield Seam(kind, conn)
    else:
        async with await db.connect_async(url, autocommit=False) as aconn:
            yield Seam(kind, aconn)


def _insert_one(key: str, payload: bytes, event_id: uuid.UUID | None = None) -> dict[str, Any]:
    return {
        "event_id": event_id or uuid.uuid4(),
        "idempotency_key": key,
        "content_digest": b"\x01\x02",
        "topic": "seam-topic",
        "message_key": key,
        "payload": payload,
        "content_type": "application/octet-stream",
        "headers": '{"h": "v"}',
        "event_type": "seam.tested",
        "schema_version": 3,
        "aggregate_type": "thing",
        "aggregate_id": f"agg-{key}",
        "deliver_after": None,
        "channel": None,
        "notified_xact": None,
        "notified_shards": [],
    }


def _insert_many(keys: list[str], payloads: list[bytes]) -> dict[str, Any]:
    rows = [_insert_one(k, p) for k, p in zip(keys, payloads, strict=True)]
    arrays = {
        f"{name}s": [row[name] for row in rows]
        for name in (
            "event_id", "idempotency_key", "content_digest", "topic", "message_key", "payload",
            "content_type", "event_type", "schema_version", "aggregate_type", "aggregate_id",
            "deliver_after",
        )
    }  # fmt: skip
    return {
        **arrays,
        "headers": [row["headers"] for row in rows],
        "channel": None,
        "notified_xact": None,
        "notified_shards": [],
    }


_ANY = {"event_type": None, "message_key": None, "topic": None, "aggregate_id": None}


def _comparable(row: tuple[Any, ...]) -> tuple[Any, ...]:
    """A ``select_outboxed`` row without what differs per insert (id, event id, created_at)."""
    assert isinstance(row[1], uuid.UUID)
    assert isinstance(row[-1], datetime)
    return (row[2], *row[3:-1])


@pytest.mark.parametrize("kind", KINDS)
async def test_run_one_rows_execute_give_the_same_results(outboxkit_db_url: str, kind: str) -> None:
    event_id = uuid.UUID("0190a0b0-0000-7000-8000-000000000001")
    async with open_seam(kind, outboxkit_db_url) as seam:
        inserted = await seam.run(q("insert_one"), _insert_one("k1", SECRET.encode(), event_id))
        assert isinstance(inserted, db.Result)
        assert inserted.rowcount == 1
        [(row_id, returned_event, shard, xact, notified)] = inserted.rows
        assert (row_id, returned_event, notified) == (1, event_id, False)
        assert isinstance(shard, int)
        assert isinstance(xact, str)
        assert type(inserted.rows[0]) is tuple

        found = await seam.call("one", q("select_outboxed"), {**_ANY, "topic": "seam-topic"})
        assert type(found) is tuple
        assert found[:12] == (
            1, event_id, "k1", "seam-topic", "k1", SECRET.encode(), "application/octet-stream",
            {"h": "v"}, "seam.tested", 3, "thing", "agg-k1",
        )  # fmt: skip
        assert found[12:14] == (shard, "pending")
        assert await seam.call("one", q("select_outboxed"), {**_ANY, "topic": "nope"}) is None

        assert await seam.call("rows", q("state_counts")) == [("pending", 1)]
        many = await seam.run(q("insert_many"), _insert_many(["k2", "k3"], [b"2", b"3"]))
        assert [r[0] for r in many.rows] == [2, 3]
        assert many.rowcount == 2
        assert await seam.call("rows", q("state_counts")) == [("pending", 3)]
        silent = _insert_many(["k4", "k5"], [b"4", b"5"])
        for name in ("channel", "notified_xact", "notified_shards"):
            del silent[name]
        assert await seam.call("execute", q("insert_many_silent"), silent) == 2

        async def insert_then_fail() -> None:
            async with seam.savepoint():
                await seam.run(q("insert_one"), _insert_one("k6", b"6"))
                raise RuntimeError("undo k6 only")

        with pytest.raises(RuntimeError):
            await insert_then_fail()
        async with seam.savepoint():
            await seam.run(q("insert_one"), _insert_one("k7", b"7"))
        remaining = await seam.call("rows", q("select_outboxed"), _ANY)
        assert [r[2] for r in remaining] == ["k1", "k2", "k3", "k4", "k5", "k7"]
        await seam.rollback()


@pytest.mark.parametrize("kind", KINDS)
async def test_binary_and_text_parameters_give_the_same_rows(
    outboxkit_db_url: str, kind: str
) -> None:
    payloads = [b"\x00\xff binary", SECRET.encode(), b""]
    async with open_seam(kind, outboxkit_db_url) as seam:
        await seam.run(q("insert_many"), _insert_many(["b1", "b2", "b3"], payloads), binary=True)
        await seam.run(q("insert_many"), _insert_many(["t1", "t2", "t3"], payloads), binary=False)
        await seam.run(q("insert_one"), _insert_one("b4", b"\x00one"), binary=True)
        await seam.run(q("insert_one"), _insert_one("t4", b"\x00one"), binary=False)
        as_binary = (await seam.run(q("select_outboxed"), _ANY, binary=True)).rows
        as_text = (await seam.run(q("select_outboxed"), _ANY, binary=False)).rows
        assert as_binary == as_text
        assert len(as_binary) == 8
        by_key = {row[2]: _comparable(row) for row in as_binary}
        for n in ("1", "2", "3", "4"):
            b, t = by_key[f"b{n}"], by_key[f"t{n}"]
            # Same content apart from the key and what derives from it (aggregate id, shard):
            # payload, content type, headers, event type, schema version, aggregate type.
            assert b[3:9] == t[3:9]
            assert b[-1] == t[-1] == "pending"
        assert [by_key[f"b{n}"][3] for n in "123"] == payloads
        assert by_key["t4"][3] == b"\x00one"
        await seam.rollback()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_statement_joins_the_callers_transaction(outboxkit_db_url: str, kind: str) -> None:
    with db.connect(outboxkit_db_url) as observer:

        def committed_count() -> int:
            return sum(count for _, count in db.rows(observer, q("state_counts")))

        async with open_seam(kind, outboxkit_db_url) as seam:
            await seam.run(q("insert_one"), _insert_one("tx1", b"1"))
            assert await seam.call("rows", q("state_counts")) == [("pending", 1)]
            assert committed_count() == 0  # not committed: invisible elsewhere
            await seam.rollback()
            assert await seam.call("rows", q("state_counts")) == []
            await seam.run(q("insert_one"), _insert_one("tx2", b"2"))
            await seam.commit()
        assert committed_count() == 1


async def _duplicate_event_id(seam: Seam) -> None:
    event_id = uuid.uuid4()
    await seam.run(q("insert_one"), _insert_one("e1", b"first", event_id))
    await seam.run(q("insert_one"), _insert_one("e2", SECRET.encode(), event_id))


@pytest.mark.parametrize("kind", SA_KINDS)
async def test_errors_on_sqlalchemy_targets_are_sqlalchemy_errors_without_parameters(
    outboxkit_db_url: str, kind: str
) -> None:
    async with open_seam(kind, outboxkit_db_url) as seam:
        with pytest.raises(sa.exc.IntegrityError) as caught:
            await _duplicate_event_id(seam)
        assert isinstance(caught.value, sa.exc.DBAPIError)
        assert isinstance(caught.value.orig, psycopg.errors.UniqueViolation)
        text = str(caught.value)
        assert "outboxkit outbox.insert_one" in text
        assert "[parameters:" not in text
        assert SECRET not in text
        assert "agg-e2" not in text
        assert SECRET not in "".join(traceback.format_exception(caught.value))
        await seam.rollback()  # the caller's transaction recovers as usual
        assert await seam.call("rows", q("state_counts")) == []


@pytest.mark.parametrize("kind", PSYCOPG_KINDS)
async def test_errors_on_psycopg_targets_are_psycopg_errors(
    outboxkit_db_url: str, kind: str
) -> None:
    async with open_seam(kind, outboxkit_db_url) as seam:
        with pytest.raises(psycopg.errors.UniqueViolation) as caught:
            await _duplicate_event_id(seam)
        assert isinstance(caught.value, psycopg.Error)
        assert SECRET not in str(caught.value)
        await seam.rollback()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_missing_parameter_is_named(outboxkit_db_url: str, kind: str) -> None:
    async with open_seam(kind, outboxkit_db_url) as seam:
        with pytest.raises(TypeError, match=r"outbox\.select_outboxed.*\['topic'\]"):
            await seam.run(q("select_outboxed"), {k: v for k, v in _ANY.items() if k != "topic"})


@pytest.mark.parametrize("kind", ["sa_connection", "sa_async_connection"])
async def test_a_connection_broken_under_sqlalchemy_is_invalidated(
    outboxkit_db_url: str, kind: str
) -> None:
    async with open_seam(kind, outboxkit_db_url) as seam:
        [(pid,)] = (await seam.run(db.Query("t", "pid", "SELECT pg_backend_pid()"))).rows
        with db.connect(outboxkit_db_url) as killer:
            db.run(killer, db.Query("t", "kill", "SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(sa.exc.DBAPIError) as caught:
            await seam.run(q("state_counts"))
        assert caught.value.connection_invalidated
        await seam.rollback()
        [(new_pid,)] = (await seam.run(db.Query("t", "pid", "SELECT pg_backend_pid()"))).rows
        assert new_pid != pid  # a fresh connection, not the broken one


def _prepare_all(url: str, schema: str) -> dict[str, list[str]]:
    """PREPARE each statement with ``$n`` parameters and no declared types: the server parses,
    resolves every name against the migrated schema and infers each parameter's type."""
    inferred: dict[str, list[str]] = {}
    with db.connect(url) as conn, conn.cursor() as cur:
        for area in AREAS:
            for name, query in db.queries(area, schema).items():
                if query.text.lstrip().upper().startswith(("LISTEN", "LOCK", "COPY")):
                    continue  # utility statements: not preparable (COPY: the writer's tests)
                order: list[str] = []

                def number(match: Any, order: list[str] = order) -> str:
                    if match[1] not in order:
                        order.append(match[1])
                    return f"${order.index(match[1]) + 1}"

                cur.execute(f"PREPARE outboxkit_check AS {_BIND_RE.sub(number, query.text)}")
                cur.execute(
                    "SELECT parameter_types::text[] FROM pg_prepared_statements"
                    " WHERE name = 'outboxkit_check'"
                )
                row = cur.fetchone()
                cur.execute("DEALLOCATE outboxkit_check")
                assert row is not None
                assert len(row[0]) == len(query.parameters), f"{area}.{name}"
                inferred[f"{area}.{name}"] = row[0]
    return inferred


def test_every_statement_prepares_on_the_real_schema(outboxkit_db_url: str) -> None:
    inferred = _prepare_all(outboxkit_db_url, "outboxkit")
    utility = [  # LISTEN, LOCK TABLE, COPY: not preparable
        q for a in AREAS for q in db.queries(a, "outboxkit").values()
        if q.text.lstrip().upper().startswith(("LISTEN", "LOCK", "COPY"))
    ]  # fmt: skip
    assert sorted(q.name for q in utility) == [
        "copy_rows",
        "copy_rows_default_ids",
        "listen",
        "shards_lock_table",
    ]
    assert len(inferred) == sum(len(db.queries(a, "outboxkit")) for a in AREAS) - len(utility)
    for name, types in inferred.items():
        assert "unknown" not in types, name
    assert inferred["outbox.insert_many"][0] == "uuid[]"
    claim_types = ["integer", "timestamp with time zone", "boolean", "bigint[]", "bigint", "bigint"]
    assert inferred["relay.claim_batch"] == claim_types


def test_every_statement_prepares_in_a_custom_schema(outboxkit_empty_db_url: str) -> None:
    db.migrator.upgrade(outboxkit_empty_db_url, "tenant_42")
    assert _prepare_all(outboxkit_empty_db_url, "tenant_42")
    with pytest.raises(psycopg.errors.UndefinedTable):
        _prepare_all(outboxkit_empty_db_url, "outboxkit")  # nothing there: the check can fail


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{password}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


_BAD_PASSWORDS = {
    "wrong": "N0tTheRightSecret",
    "wrong, percent-encoded": quote("N0t/The:Right@Secret", safe=""),
}


def _assert_secret_free(exc: BaseException, secret: str) -> None:
    told = "".join(traceback.format_exception(exc))
    for fragment in {secret, "RightSecret", "Right@"}:
        assert fragment not in told, told
    assert exc.__cause__ is None
    assert exc.__context__ is None


@pytest.mark.parametrize("password", list(_BAD_PASSWORDS.values()), ids=list(_BAD_PASSWORDS))
@pytest.mark.parametrize("as_secret", [False, True], ids=["str", "SecretStr"])
async def test_connect_errors_never_show_the_password(
    outboxkit_db_url: str, password: str, as_secret: bool
) -> None:
    plain = _with_password(outboxkit_db_url, password)
    url: db.Url = SecretStr(plain) if as_secret else plain
    with pytest.raises(psycopg.Error) as sync_error:
        db.connect(url, connect_timeout=10)
    _assert_secret_free(sync_error.value, password)
    with pytest.raises(psycopg.Error) as async_error:
        await db.connect_async(url, connect_timeout=10)
    _assert_secret_free(async_error.value, password)
    assert type(sync_error.value) is type(async_error.value)
    assert "password authentication failed" in str(sync_error.value)
    with pytest.raises(psycopg.Error) as via_migrator:
        db.migrator.status(url)
    _assert_secret_free(via_migrator.value, password)


def test_keyword_connection_strings_are_redacted_too(outboxkit_db_url: str) -> None:
    wrong = _BAD_PASSWORDS["wrong"]
    parts = urlsplit(outboxkit_db_url)
    dsn = (
        f"host={parts.hostname} port={parts.port} user={parts.username}"
        f" password='{wrong}' dbname=postgres connect_timeout=10"
    )
    with pytest.raises(psycopg.OperationalError) as caught:
        db.connect(dsn)
    _assert_secret_free(caught.value, wrong)
    with pytest.raises(psycopg.OperationalError) as given:
        db.connect(_with_password(outboxkit_db_url, ""), password=wrong)
    _assert_secret_free(given.value, wrong)


def test_notify_channel_reaches_a_listener_through_the_seam(outboxkit_db_url: str) -> None:
    """``insert_one`` notifies on commit only, once, on the schema's channel (a quoted name)."""
    channel = notify_channel("outboxkit")
    with db.connect(outboxkit_db_url) as listener:
        db.listen(listener, channel)
        with db.connect(outboxkit_db_url, autocommit=False) as writer:
            params = {**_insert_one("n1", b"1"), "channel": channel}
            [row] = db.rows(writer, q("insert_one"), params)
            assert row[-1] is True
            assert list(listener.notifies(timeout=0.5, stop_after=1)) == []  # not before commit
            writer.commit()
        got = list(listener.notifies(timeout=10, stop_after=1))
    assert [(n.channel, n.payload) for n in got] == [(channel, str(row[2]))]


async def test_our_async_connection_closes_at_once_whatever_the_block_left_behind(
    outboxkit_db_url: str,
) -> None:
    """A block that leaves the connection busy (a ``notifies()`` generator left suspended holds
    its lock) still closes it at once. psycopg's own ``async with`` would first commit, waiting
    for that lock: a cancellation there skips the close and leaks the connection."""
    channel = notify_channel("outboxkit")
    async with db.connection_async(outboxkit_db_url) as conn:
        await db.listen_async(conn, channel)
        with db.connect(outboxkit_db_url) as writer:
            db.run(writer, db.Query("t", "notify", "SELECT pg_notify(:c, '1')"), {"c": channel})
        notifications = conn.notifies()  # referenced until the end: nothing frees the lock
        async for _ in notifications:
            break
        assert conn.lock.locked()
    assert conn.closed
    await notifications.aclose()


async def test_listen_async(outboxkit_db_url: str) -> None:
    channel = notify_channel("t" * 60)  # too long for a channel: hashed
    async with db.connection_async(outboxkit_db_url) as listener:
        await db.listen_async(listener, channel)
        with db.connect(outboxkit_db_url) as writer:
            db.run(writer, db.Query("t", "notify", "SELECT pg_notify(:c, '7')"), {"c": channel})
        got = [n async for n in listener.notifies(timeout=10, stop_after=1)]
    assert [(n.channel, n.payload) for n in got] == [(channel, "7")]
