"""The schema: concurrent `migrate up`, what the migrations create, the CLI, the Alembic helper."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations
from click.testing import CliRunner, Result

from outboxkit import alembic_ops
from outboxkit.cli import main
from outboxkit.db import migrator, sqlalchemy_url
from outboxkit.schema import InboxState, OutboxState
from tests.support.migrate_cli import CLI, migrate_up_processes

pytestmark = pytest.mark.integration


def cli(*args: str, url: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "OUTBOXKIT_DATABASE_URL"}
    if url is not None:
        environ["OUTBOXKIT_DATABASE_URL"] = url
    environ.update(env)
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, env=environ, timeout=120, check=False
    )


def in_process(*args: str, url: str | None = None) -> Result:
    """The same command through click in this process: no interpreter start per call."""
    result = CliRunner().invoke(
        main, list(args), env={"OUTBOXKIT_DATABASE_URL": url}, catch_exceptions=False
    )
    return result


def test_four_concurrent_migrate_up_on_an_empty_database(outboxkit_empty_db_url: str) -> None:
    procs = migrate_up_processes(outboxkit_empty_db_url, 4)
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outputs
    applied_lines = [out for out, _ in outputs if out.startswith("applied")]
    assert len(applied_lines) == 1  # exactly one process did the work, the rest found it done
    current = migrator.status(outboxkit_empty_db_url)
    assert current.is_current
    assert current.applied == tuple(m.version for m in migrator.load_migrations())
    assert_schema_matches_migrations(outboxkit_empty_db_url, "outboxkit")


def _live_schema(url: str, schema: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        tables = {
            name: {}
            for (name,) in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relkind IN ('r', 'p')",
                (schema,),
            )
        }
        for table, column, type_, notnull in conn.execute(
            "SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull"
            " FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND a.attnum > 0"
            " AND NOT a.attisdropped ORDER BY a.attnum",
            (schema,),
        ):
            tables[table][column] = (type_, not notnull)
        pkeys = {
            table: sorted(cols)
            for table, cols in conn.execute(
                "SELECT c.relname, array_agg(a.attname::text) FROM pg_index i"
                " JOIN pg_class c ON c.oid = i.indrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY (i.indkey)"
                " WHERE n.nspname = %s AND i.indisprimary GROUP BY c.relname",
                (schema,),
            )
        }
        sequences = sorted(
            name
            for (name,) in conn.execute(
                "SELECT sequencename FROM pg_sequences WHERE schemaname = %s",
                (schema,),
            )
        )
        identity_sequences = {
            name
            for (name,) in conn.execute(
                "SELECT s.relname FROM pg_depend d JOIN pg_class s ON s.oid = d.objid"
                " WHERE s.relkind = 'S' AND d.deptype = 'i'"
            )
        }
    return {
        "tables": tables,
        "pkeys": pkeys,
        "sequences": [s for s in sequences if s not in identity_sequences],
        "indexes": _indexes(url, schema),
    }


def _indexes(url: str, schema: str) -> dict[str, tuple[str, str, bool]]:
    """Index -> (its table, its definition without the schema, valid) of the schema's indexes."""
    with psycopg.connect(url) as conn:
        return {
            name: (table, definition, valid)
            for name, table, definition, valid in conn.execute(
                "SELECT c.relname, t.relname,"
                " replace(pg_get_indexdef(c.oid), ' ON ' || quote_ident(n.nspname) || '.', ' ON '),"
                " i.indisvalid"
                " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " JOIN pg_class t ON t.oid = i.indrelid"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s",
                (schema,),
            )
        }


_TABLE_RE = re.compile(r"^CREATE TABLE (\w+) \((.*?)^\);", re.MULTILINE | re.DOTALL)
_ADD_COLUMN_RE = re.compile(
    r"^ALTER TABLE (\w+) ADD COLUMN (?:IF NOT EXISTS )?(\w+)", re.MULTILINE | re.IGNORECASE
)
_CONSTRAINT_RE = re.compile(r"ALTER TABLE \w+ (?:ADD|DROP) CONSTRAINT", re.IGNORECASE)
_NOT_A_COLUMN = {"primary", "constraint", "unique", "check", "foreign", "exclude"}


def _declared_tables() -> dict[str, list[str]]:
    """Table -> column names, in order, as the migration files' CREATE TABLE statements say.

    Only CREATE TABLE, ALTER TABLE .. ADD COLUMN and ALTER TABLE .. ADD/DROP CONSTRAINT are
    understood: a migration that alters a
    table otherwise must extend this reading (the test then fails until it does, rather than
    passing on a stale picture).
    """
    # The migrator's own bookkeeping, created before the first migration.
    tables = {"schema_migration": ["version", "name", "checksum", "applied_at"]}
    for migration in migrator.load_migrations():
        added = _ADD_COLUMN_RE.findall(migration.sql)
        constraints = len(_CONSTRAINT_RE.findall(migration.sql))  # no column changes
        altered = migration.sql.upper().count("ALTER TABLE")
        assert altered == len(added) + constraints, "teach _declared_tables this ALTER TABLE"
        for name, body in _TABLE_RE.findall(migration.sql):
            columns = []
            for line in body.splitlines():
                word = line.strip().split(" ", 1)[0].lower()
                if re.fullmatch(r"[a-z_][a-z0-9_]*", word) and word not in _NOT_A_COLUMN:
                    columns.append(word)
            tables[name] = columns
        for name, column in added:
            tables[name].append(column.lower())
    return tables


def assert_schema_matches_migrations(url: str, schema: str) -> None:
    live = _live_schema(url, schema)
    declared = _declared_tables()
    assert sorted(live["tables"]) == sorted(declared), (
        "the tables in the schema differ from the migrations' CREATE TABLE statements"
    )
    for name, columns in live["tables"].items():
        assert list(columns) == declared[name], f"columns of {name} differ"


def test_migrations_declare_the_runtime_tables() -> None:
    declared = _declared_tables()
    assert set(declared) == {
        "schema_migration", "outbox_setting", "outbox_message", "relay_lease", "relay_control",
        "relay_producer_slots",
        "inbox_message", "inbox_rejection",
    }  # fmt: skip
    assert declared["outbox_message"][:3] == ["id", "event_id", "idempotency_key"]
    assert "finished_at" in declared["inbox_message"]


def test_a_custom_schema_gets_the_same_structure(outboxkit_empty_db_url: str) -> None:
    """No migration names the default schema: every object lands in the one asked for."""
    migrator.upgrade(outboxkit_empty_db_url)
    migrator.upgrade(outboxkit_empty_db_url, "tenant_42")
    assert _live_schema(outboxkit_empty_db_url, "tenant_42") == _live_schema(
        outboxkit_empty_db_url, "outboxkit"
    )
    for schema in ("outboxkit", "tenant_42"):
        assert_schema_matches_migrations(outboxkit_empty_db_url, schema)
    with psycopg.connect(outboxkit_empty_db_url) as conn:
        stray = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public'"
        ).fetchall()
    assert stray == []


def test_schema_comparison_catches_drift(outboxkit_empty_db_url: str) -> None:
    migrator.upgrade(outboxkit_empty_db_url)
    with psycopg.connect(outboxkit_empty_db_url) as conn:
        conn.execute("CREATE TABLE outboxkit.surprise (id int PRIMARY KEY)")
    with pytest.raises(AssertionError, match="tables in the schema differ"):
        assert_schema_matches_migrations(outboxkit_empty_db_url, "outboxkit")
    with psycopg.connect(outboxkit_empty_db_url) as conn:
        conn.execute("DROP TABLE outboxkit.surprise")
        conn.execute("ALTER TABLE outboxkit.outbox_message DROP COLUMN kafka_offset")
    with pytest.raises(AssertionError, match="columns of outbox_message differ"):
        assert_schema_matches_migrations(outboxkit_empty_db_url, "outboxkit")


_PURGE_INDEXES = {
    "inbox_message_consumer_finished_idx": (
        "inbox_message",
        "CREATE INDEX inbox_message_consumer_finished_idx ON inbox_message USING btree"
        " (consumer, finished_at) WHERE (state <> 'processing'::text)",
        True,
    ),
    "inbox_rejection_consumer_created_idx": (
        "inbox_rejection",
        "CREATE INDEX inbox_rejection_consumer_created_idx ON inbox_rejection USING btree"
        " (consumer, created_at)",
        True,
    ),
}
_OLD_PURGE_INDEXES = {"inbox_message_finished_idx", "inbox_rejection_created_idx"}


def _at_0003(url: str) -> None:
    """The schema as 0003 left it: the rendered migrations up to 0004, applied as psql would."""
    head, found, _ = migrator.render_sql("outboxkit").partition("\n-- 0004_")
    assert found
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute((head + "\nCOMMIT;\n").encode())
    assert migrator.status(url).pending[0] == 4
    assert set(_indexes(url, "outboxkit")) >= _OLD_PURGE_INDEXES


def _oids(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT relname, oid FROM pg_class WHERE relname = ANY (%s)", (list(_PURGE_INDEXES),)
        )
        return dict(found.fetchall())


def test_0004_replaces_the_inbox_purge_indexes(outboxkit_empty_db_url: str) -> None:
    """Led by the consumer, and the old ones gone: both would cost every finished row one more
    index entry."""
    _at_0003(outboxkit_empty_db_url)
    assert 4 in migrator.upgrade(outboxkit_empty_db_url)
    indexes = _indexes(outboxkit_empty_db_url, "outboxkit")
    assert {name: indexes.get(name) for name in _PURGE_INDEXES} == _PURGE_INDEXES
    assert not _OLD_PURGE_INDEXES & set(indexes)
    inbox = {name for name, (table, _, _) in indexes.items() if table.startswith("inbox_")}
    assert inbox == {
        "inbox_message_pkey", "inbox_message_consumer_finished_idx", "inbox_rejection_pkey",
        "inbox_rejection_consumer_topic_kafka_partition_kafka_offset_key",
        "inbox_rejection_event_idx", "inbox_rejection_consumer_created_idx",
    }  # fmt: skip


def test_0004_keeps_indexes_an_operator_built_concurrently(outboxkit_empty_db_url: str) -> None:
    url = outboxkit_empty_db_url
    _at_0003(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE INDEX CONCURRENTLY inbox_message_consumer_finished_idx"
            " ON outboxkit.inbox_message (consumer, finished_at) WHERE state <> 'processing'"
        )
        conn.execute(
            "CREATE INDEX CONCURRENTLY inbox_rejection_consumer_created_idx"
            " ON outboxkit.inbox_rejection (consumer, created_at)"
        )
    built = _oids(url)
    assert 4 in migrator.upgrade(url)
    assert _oids(url) == built  # not built again
    indexes = _indexes(url, "outboxkit")
    assert {name: indexes.get(name) for name in _PURGE_INDEXES} == _PURGE_INDEXES
    assert not _OLD_PURGE_INDEXES & set(indexes)


def test_0004_rebuilds_a_failed_or_different_index_of_the_same_name(
    outboxkit_empty_db_url: str,
) -> None:
    """A concurrent build that failed leaves an invalid index under the name; one defined
    otherwise would serve no purge. IF NOT EXISTS alone would keep either."""
    url = outboxkit_empty_db_url
    _at_0003(url)
    with psycopg.connect(url) as writer, psycopg.connect(url, autocommit=True) as conn:
        # A build waits for the table's open writes; one cut short by lock_timeout (as by a
        # cancel) leaves its index behind, invalid, under the name.
        writer.execute(
            "INSERT INTO outboxkit.inbox_rejection"
            " (consumer, reason, topic, kafka_partition, kafka_offset) VALUES ('c', 'r', 't', 0, 1)"
        )
        conn.execute("SET lock_timeout = '100ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            conn.execute(
                "CREATE INDEX CONCURRENTLY inbox_rejection_consumer_created_idx"
                " ON outboxkit.inbox_rejection (consumer, created_at)"
            )
        writer.rollback()
        conn.execute(
            "CREATE INDEX CONCURRENTLY inbox_message_consumer_finished_idx"
            " ON outboxkit.inbox_message (finished_at)"
        )
    indexes = _indexes(url, "outboxkit")
    invalid = (*_PURGE_INDEXES["inbox_rejection_consumer_created_idx"][:2], False)
    assert indexes["inbox_rejection_consumer_created_idx"] == invalid
    assert 4 in migrator.upgrade(url)
    indexes = _indexes(url, "outboxkit")
    assert {name: indexes.get(name) for name in _PURGE_INDEXES} == _PURGE_INDEXES


def _check_values(url: str, table: str) -> set[str]:
    """The values the CHECK constraint on ``table.state`` allows, as the server enforces it."""
    with psycopg.connect(url) as conn:
        definitions = [
            d
            for (d,) in conn.execute(
                "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c"
                " WHERE c.conrelid = %s::regclass AND c.contype = 'c'",
                (f"outboxkit.{table}",),
            )
            if "state = ANY" in d
        ]
    assert len(definitions) == 1, definitions
    return set(re.findall(r"'([a-z_]+)'::text", definitions[0]))


def test_state_checks_equal_the_state_enums(outboxkit_db_url: str) -> None:
    assert _check_values(outboxkit_db_url, "outbox_message") == {s.value for s in OutboxState}
    assert _check_values(outboxkit_db_url, "inbox_message") == {s.value for s in InboxState}


def test_cli_check_status_and_sql(outboxkit_empty_db_url: str) -> None:
    url = outboxkit_empty_db_url
    # The installed script in its own process once (exit code, stderr); the rest in process.
    behind = cli("migrate", "check", url=url)
    assert behind.returncode == 1
    assert "pending" in behind.stderr
    again = in_process("migrate", "check", url=url)
    assert (again.exit_code, again.stderr) == (1, behind.stderr)
    full_sql = in_process("migrate", "sql")
    assert full_sql.exit_code == 0
    assert full_sql.stdout == migrator.render_sql("outboxkit")
    assert "CREATE TABLE outbox_message" in full_sql.stdout

    up = in_process("migrate", "up", "--database-url", url)
    assert up.exit_code == 0, up.stderr
    assert in_process("migrate", "up", url=url).stdout.startswith("schema outboxkit is up to date")
    assert in_process("migrate", "check", url=url).exit_code == 0
    status = in_process("migrate", "status", url=url)
    assert status.exit_code == 0
    assert "pending" not in status.stdout
    nothing_left = in_process("migrate", "sql", url=url).stdout
    assert "CREATE TABLE outbox_message" not in nothing_left
    assert "-- 0001" not in nothing_left

    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO outboxkit.schema_migration VALUES (9999, 'from_the_future', 'x')")
    ahead = in_process("migrate", "check", url=url)
    assert ahead.exit_code == 1
    assert "ahead" in ahead.stderr
    assert in_process("migrate", "up", url=url).exit_code != 0  # refuses an unknown schema

    other = in_process("migrate", "check", "--schema", "elsewhere", url=url)
    assert other.exit_code == 1
    missing = in_process("migrate", "check")
    assert missing.exit_code == 2
    assert "database-url" in missing.stderr


def test_sql_output_applies_with_psql_semantics(outboxkit_empty_db_url: str) -> None:
    script = cli("migrate", "sql", "--schema", "by_hand").stdout
    with psycopg.connect(outboxkit_empty_db_url, autocommit=True) as conn:
        conn.execute(script.encode())
    assert migrator.status(outboxkit_empty_db_url, "by_hand").is_current


def test_alembic_helper_runs_migrations_and_keeps_search_path(outboxkit_empty_db_url: str) -> None:
    engine = sa.create_engine(sqlalchemy_url(outboxkit_empty_db_url))
    try:
        with engine.begin() as conn:
            ops = Operations(MigrationContext.configure(conn))
            # Not the default "$user", public: the dev stack's user is called outboxkit too.
            conn.execute(sa.text("SET search_path TO public"))
            before = conn.execute(sa.text("SHOW search_path")).scalar()
            applied = alembic_ops.upgrade(ops)
            assert applied == [m.version for m in migrator.load_migrations()]
            assert conn.execute(sa.text("SHOW search_path")).scalar() == before
            ops.create_table("app_thing", sa.Column("id", sa.Integer, primary_key=True))
            assert alembic_ops.upgrade(ops) == []
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT to_regclass('public.app_thing')")).scalar()
        assert migrator.status(outboxkit_empty_db_url).is_current
    finally:
        engine.dispose()


def test_alembic_helper_first_in_a_revision_rolls_back_with_it(outboxkit_empty_db_url: str) -> None:
    """A revision whose first statement is the helper (Alembic's transaction_per_migration:
    SQLAlchemy has begun, the driver has sent nothing yet) must not commit outboxkit's part on
    its own: a revision that fails afterwards takes it back with everything else."""
    engine = sa.create_engine(sqlalchemy_url(outboxkit_empty_db_url))

    def failing_revision() -> None:
        with engine.begin() as conn:
            alembic_ops.upgrade(Operations(MigrationContext.configure(conn)))
            raise RuntimeError("the revision failed")

    try:
        with pytest.raises(RuntimeError, match="the revision failed"):
            failing_revision()
        assert migrator.status(outboxkit_empty_db_url).applied == ()
        with engine.begin() as conn:  # and the helper's transaction is the revision's
            alembic_ops.upgrade(Operations(MigrationContext.configure(conn)))
            assert conn.execute(sa.text("SELECT count(*) FROM outboxkit.outbox_setting")).scalar()
        assert migrator.status(outboxkit_empty_db_url).is_current
    finally:
        engine.dispose()


def test_alembic_helper_opens_a_revision_at_read_committed(outboxkit_empty_db_url: str) -> None:
    """Under a REPEATABLE READ default a second concurrent run would take its snapshot before
    the migration lock and re-run every migration (as `migrate up` did): the helper opens the
    revision's transaction at READ COMMITTED, as `migrate up` opens its own."""
    with psycopg.connect(outboxkit_empty_db_url, autocommit=True) as conn:
        name = conn.info.dbname
        conn.execute(
            f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'"
        )
    engine = sa.create_engine(sqlalchemy_url(outboxkit_empty_db_url))
    try:
        with engine.begin() as conn:
            alembic_ops.upgrade(Operations(MigrationContext.configure(conn)))
            level = conn.execute(sa.text("SHOW transaction_isolation")).scalar()
        assert level == "read committed"
    finally:
        engine.dispose()


@pytest.mark.parametrize("schema", ["outboxkit", "tenant_42"])
def test_alembic_autogenerate_filter(outboxkit_empty_db_url: str, schema: str) -> None:
    migrator.upgrade(outboxkit_empty_db_url, schema)
    # search_path: not the default "$user", public (the dev stack's user is called outboxkit).
    engine = sa.create_engine(
        sqlalchemy_url(outboxkit_empty_db_url),
        connect_args={"options": "-c search_path=public"},
    )
    app = sa.MetaData()
    sa.Table("app_thing", app, sa.Column("id", sa.Integer, primary_key=True))
    if schema == "outboxkit":
        include_object, include_name = alembic_ops.include_object, alembic_ops.include_name
    else:
        include_object = alembic_ops.include_object_for(schema)
        include_name = alembic_ops.include_name_for(schema)
    seen: list[str] = []

    def mine(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
        seen.append(f"{type_}:{name}")
        return True

    try:
        with engine.connect() as conn:
            conn.execute(sa.text("CREATE TABLE app_thing (id integer PRIMARY KEY)"))
            conn.execute(sa.text("CREATE TABLE app_gone (id integer PRIMARY KEY)"))

            def diff(**options: Any) -> list[Any]:
                ctx = MigrationContext.configure(conn, opts={"include_schemas": True, **options})
                return compare_metadata(ctx, app)

            unfiltered = diff()  # reflects outboxkit's schema too: no warning (xid8 known)
            assert any("outbox_message" in repr(d) for d in unfiltered)
            for only_app in (
                diff(include_object=include_object),
                diff(include_name=include_name),
                diff(include_object=alembic_ops.include_object_for(schema, chain=mine)),
            ):
                # Only the application's own drift is left: the table its models dropped.
                assert [d[0] for d in only_app] == ["remove_table"], only_app
                assert only_app[0][1].name == "app_gone"
            assert "table:app_gone" in seen
            assert not any("outbox" in s or "inbox" in s or "relay" in s for s in seen)
            kept = diff(include_object=alembic_ops.include_object_for(schema, include=True))
            assert kept
            assert all(d[1].schema == schema for d in kept if hasattr(d[1], "schema"))
            conn.rollback()
    finally:
        engine.dispose()
