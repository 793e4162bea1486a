"""Least privilege: each part runs under its own role with exactly the documented grants.

The owner role migrates a fresh schema and applies ``outboxkit migrate grants --apply``; the
application writes, the relay publishes (exactly-once) and an inbox consumer processes, each as
its own role; the application role is refused what it must never do.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from outboxkit import db
from outboxkit.cli import main
from outboxkit.db import migrator
from outboxkit.events import Message
from outboxkit.inbox import Inbox, InboxSettings, OutcomeKind
from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.retention import purge_finished
from outboxkit.outbox import Outbox
from tests.integration.inbox_support import REGISTRY, headers_for, payload
from tests.relay_support import (
    consume,
    relay_settings,
    row_states,
    running_relay,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

KINDS = ("owner", "app", "relay", "consumer")


def _as(url: str, role: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}:{password}@{host}"))


@pytest.fixture
def roles(outboxkit_db_url: str) -> Iterator[dict[str, str]]:
    """kind -> URL of a fresh LOGIN role; the owner owns a freshly migrated schema."""
    suffix = uuid.uuid4().hex[:8]
    names = {kind: f"ok_{kind}_{suffix}" for kind in KINDS}
    password = uuid.uuid4().hex
    dbname = urlsplit(outboxkit_db_url).path.lstrip("/")
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        for name in names.values():
            conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
        conn.execute("DROP SCHEMA outboxkit CASCADE")
        conn.execute(f'GRANT CREATE, CONNECT ON DATABASE "{dbname}" TO {names["owner"]}')
    try:
        yield {kind: _as(outboxkit_db_url, name, password) for kind, name in names.items()}
    finally:
        with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS outboxkit CASCADE")
            for name in names.values():
                conn.execute(f"DROP OWNED BY {name}")
                conn.execute(f"DROP ROLE {name}")


def _role_names(urls: dict[str, str]) -> dict[str, str]:
    return {kind: str(urlsplit(url).username) for kind, url in urls.items()}


def _refused(url: str, statement: str) -> None:
    with (
        psycopg.connect(url, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute(statement)


async def test_each_part_works_under_its_role(
    roles: dict[str, str],
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: object,
) -> None:
    names = _role_names(roles)
    migrator.upgrade(roles["owner"], "outboxkit")
    result = CliRunner().invoke(
        main,
        [
            "migrate",
            "grants",
            "--app",
            names["app"],
            "--relay",
            names["relay"],
            "--consumer",
            names["consumer"],
            "--apply",
            "--database-url",
            roles["owner"],
        ],
    )
    assert result.exit_code == 0, result.output
    assert "applied" in result.output

    # The application writes (one and many) with INSERT and the read-backs it needs only.
    topic = outboxkit_topic()  # type: ignore[operator]
    engine = sa.create_engine(db.sqlalchemy_url(roles["app"]))
    try:
        with engine.begin() as conn:
            first = Outbox().add(conn, Message(topic, b"one", key="k"), idempotency_key="i-1")
            Outbox().add_many(conn, [Message(topic, f"m{i}".encode(), key="k") for i in range(4)])
        with engine.begin() as conn:  # an idempotent retry: the re-read path
            again = Outbox().add(conn, Message(topic, b"one", key="k"), idempotency_key="i-1")
        assert again.duplicate
        assert again.event_id == first.event_id
    finally:
        engine.dispose()
    assert row_states(outboxkit_db_url) == {"pending": 5}

    # What the application must never do.
    _refused(roles["app"], "UPDATE outboxkit.relay_lease SET holder = 'me'")
    _refused(
        roles["app"],
        "INSERT INTO outboxkit.relay_lease (relay_group, shard, token,"
        " expires_at) VALUES ('g', 0, 1, now())",
    )
    _refused(roles["app"], "UPDATE outboxkit.outbox_message SET state = 'discarded'")
    _refused(roles["app"], "DELETE FROM outboxkit.outbox_message")
    _refused(roles["app"], "SELECT payload FROM outboxkit.outbox_message")
    _refused(roles["app"], "SELECT count(*) FROM outboxkit.inbox_message")
    _refused(roles["app"], "SELECT count(*) FROM outboxkit.inbox_rejection")
    _refused(roles["relay"], "SELECT count(*) FROM outboxkit.inbox_message")
    _refused(roles["relay"], "UPDATE outboxkit.outbox_setting SET shard_count = 2")
    _refused(roles["consumer"], "SELECT count(*) FROM outboxkit.outbox_message")

    # The relay publishes everything, exactly once, as its role.
    settings = relay_settings(roles["relay"], outboxkit_kafka_bootstrap, mode="exactly_once")
    async with running_relay(settings):
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": 5}, what="published as relay"
        )
    assert [r.value for r in consume(outboxkit_kafka_bootstrap, topic, expect=5)] == [
        b"one",
        b"m0",
        b"m1",
        b"m2",
        b"m3",
    ]

    # An inbox consumer processes (and deduplicates) as its role.
    consumer_engine = sa.create_engine(db.sqlalchemy_url(roles["consumer"]))
    try:
        inbox = Inbox(
            consumer_engine,
            lambda event, ctx, session: None,
            InboxSettings(consumer="billing", registry=REGISTRY),
        )
        event_id = str(uuid.uuid4())
        env = Envelope.from_parts(
            topic="payments",
            partition=0,
            offset=0,
            key=b"k",
            value=payload("o1", 1),
            headers=headers_for(event_id),
            timestamp_ms=None,
        )
        assert inbox.process(env).kind is OutcomeKind.SUCCEEDED
        assert inbox.process(env).kind is OutcomeKind.DUPLICATE
    finally:
        consumer_engine.dispose()


def test_the_consumer_role_purges_its_finished_rows_and_rejections(roles: dict[str, str]) -> None:
    """The purge locks its batch (FOR UPDATE SKIP LOCKED), which needs UPDATE on a column of
    each table: without it every purge round failed on the rejection log, which then grew
    without bound (the consumer loop only logs a failed round)."""
    names = _role_names(roles)
    migrator.upgrade(roles["owner"], "outboxkit")
    command = ["migrate", "grants", "--consumer", names["consumer"], "--apply"]
    result = CliRunner().invoke(main, [*command, "--database-url", roles["owner"]])
    assert result.exit_code == 0, result.output
    with psycopg.connect(roles["owner"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outboxkit.inbox_message (consumer, event_id, state, finished_at)"
            " VALUES ('billing', 'old', 'succeeded', now() - interval '2 days')"
        )
        conn.execute(
            "INSERT INTO outboxkit.inbox_rejection"
            " (consumer, reason, topic, kafka_partition, kafka_offset, created_at)"
            " VALUES ('billing', 'old', 't', 0, 0, now() - interval '2 days')"
        )
    engine = sa.create_engine(db.sqlalchemy_url(roles["consumer"]))
    try:
        purged = purge_finished(engine, consumer="billing", window_seconds=86400)
    finally:
        engine.dispose()
    assert (purged.messages, purged.rejections) == (1, 1)
    # UPDATE (id) can only renumber a rejection (an identity column), not change what it says.
    _refused(roles["consumer"], "UPDATE outboxkit.inbox_rejection SET reason = 'x'")
    _refused(roles["consumer"], "UPDATE outboxkit.inbox_rejection SET created_at = now()")


def test_migrate_grants_narrows_an_older_whole_table_insert(roles: dict[str, str]) -> None:
    """A deployment granted INSERT on the whole outbox table (earlier versions) converges on
    the written columns by re-running ``migrate grants``: the application can no longer store a
    parked row (which would hold back every pending row of its key in its shard) or set the
    relay's columns, and still writes on the INSERT and COPY paths."""
    names = _role_names(roles)
    migrator.upgrade(roles["owner"], "outboxkit")
    with psycopg.connect(roles["owner"], autocommit=True) as conn:
        conn.execute(f"GRANT INSERT ON outboxkit.outbox_message TO {names['app']}")
    command = ["migrate", "grants", "--app", names["app"], "--apply"]
    for _ in range(2):  # idempotent
        result = CliRunner().invoke(main, [*command, "--database-url", roles["owner"]])
        assert result.exit_code == 0, result.output
        assert "warning" not in result.output

    row = (
        "INSERT INTO outboxkit.outbox_message (event_id, idempotency_key, content_digest, topic,"
        " message_key, payload, shard{}) VALUES (gen_random_uuid(), 'p', '\\x00', 't', 'k',"
        " '\\x00', 0{})"
    )
    _refused(roles["app"], row.format(", state", ", 'parked'"))
    _refused(roles["app"], row.format(", attempts", ", 99"))
    _refused(roles["app"], row.format(", published_at", ", now()"))
    with psycopg.connect(roles["app"]) as conn:  # the row with the defaults is stored
        conn.execute(row.format("", ""))
        conn.rollback()

    engine = sa.create_engine(db.sqlalchemy_url(roles["app"]))
    try:
        with engine.begin() as conn:
            Outbox().add(conn, Message("t", b"one", key="k"), idempotency_key="i-1")
            copied = Outbox(copy_min_rows=2).add_many(
                conn, [Message("t", f"m{i}".encode(), key="k") for i in range(3)]
            )
            again = Outbox().add(conn, Message("t", b"one", key="k"), idempotency_key="i-1")
        assert again.duplicate
        assert len({w.id for w in copied}) == 3
    finally:
        engine.dispose()
    with psycopg.connect(roles["owner"]) as conn:
        states = conn.execute(
            "SELECT state, count(*) FROM outboxkit.outbox_message GROUP BY state"
        ).fetchall()
        table_wide = conn.execute(
            "SELECT has_table_privilege(%s, 'outboxkit.outbox_message', 'INSERT')",
            [names["app"]],
        ).fetchone()
    assert states == [("pending", 4)]
    assert table_wide == (False,)


def test_migrate_grants_warns_when_the_app_may_still_set_state_through_another_grant(
    roles: dict[str, str], outboxkit_db_url: str
) -> None:
    """The REVOKE removes only what was granted to the role itself: an INSERT it holds through a
    role it belongs to survives, and with it the role could still store a parked row. The
    command says so instead of reporting success alone."""
    names = _role_names(roles)
    migrator.upgrade(roles["owner"], "outboxkit")
    with psycopg.connect(roles["owner"], autocommit=True) as conn:
        conn.execute(f"GRANT INSERT ON outboxkit.outbox_message TO {names['relay']}")
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:  # membership: a superuser
        conn.execute(f"GRANT {names['relay']} TO {names['app']}")
    command = ["migrate", "grants", "--app", names["app"], "--apply"]
    result = CliRunner().invoke(main, [*command, "--database-url", roles["owner"]])
    assert result.exit_code == 0, result.output
    assert f"warning: role {names['app']} may still INSERT outboxkit.outbox_message.state" in (
        result.output
    )


def test_an_owner_without_create_on_the_database_upgrades_its_existing_schema(
    roles: dict[str, str], outboxkit_db_url: str
) -> None:
    """CREATE on the database is needed the first time only: once the schema exists, its
    owner upgrades it without (before, every `migrate up` ran CREATE SCHEMA IF NOT EXISTS,
    which PostgreSQL refuses without the privilege even when the schema is there)."""
    owner = str(urlsplit(roles["owner"]).username)
    dbname = urlsplit(outboxkit_db_url).path.lstrip("/")
    migrator.upgrade(roles["owner"], "outboxkit")
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(f'REVOKE CREATE ON DATABASE "{dbname}" FROM {owner}, PUBLIC')
        conn.execute("DELETE FROM outboxkit.schema_migration WHERE version = 7")
        conn.execute("DROP TABLE outboxkit.relay_producer_slots")
    _refused(roles["owner"], "CREATE SCHEMA elsewhere")
    assert migrator.upgrade(roles["owner"], "outboxkit") == [7]
    assert migrator.upgrade(roles["owner"], "outboxkit") == []
    assert "CREATE SCHEMA" not in migrator.render_sql("outboxkit", after=6)
