"""Apply the plain-SQL migrations in ``migrations/`` under a transaction-scoped advisory lock.

The SQL files are the one source of truth for the schema. Each run takes
``pg_advisory_xact_lock(hashtext('outboxkit.migrate.' || schema))`` inside its transaction, so any
number of processes can migrate a fresh database at once: one applies, the others wait, then find
nothing left to do. The lock is released by COMMIT/ROLLBACK, never leaked, and works behind a
transaction-pooling PgBouncer.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from outboxkit.db.connect import Url, connect
from outboxkit.db.queries import query
from outboxkit.errors import MigrationError, SchemaError
from outboxkit.schema import DEFAULT_SCHEMA, quoted, validate_schema_name

_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Runs of one ``upgrade`` on a connection of its own while PostgreSQL picks it as the victim of
# a deadlock (each run waits for the other side's locks: no back-off is needed).
DEADLOCK_RUNS = 5

logger = logging.getLogger("outboxkit.migrate")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class MigrationStatus:
    applied: tuple[int, ...]
    pending: tuple[int, ...]
    unknown: tuple[int, ...]  # applied in the database, unknown to this version of outboxkit
    changed: tuple[int, ...]  # applied, but the file's checksum differs

    @property
    def is_current(self) -> bool:
        return not (self.pending or self.unknown or self.changed)


def migrations_dir() -> Path:
    """The SQL files: shipped in the wheel as ``outboxkit/_migrations``, or the repo's folder."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if candidate.is_dir():
            return candidate
    raise MigrationError("the outboxkit migrations folder is missing from the installation")


@cache
def load_migrations() -> tuple[Migration, ...]:
    found = []
    for path in sorted(migrations_dir().iterdir()):
        match = _FILE_RE.match(path.name)
        if match:
            found.append(Migration(int(match[1]), match[2], path.read_text()))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise MigrationError(f"migration files must be numbered 0001.. without gaps: {versions}")
    return tuple(found)


def latest_version() -> int:
    return load_migrations()[-1].version


Target = Url | psycopg.Connection[Any]


@contextmanager
def _connect(target: Target) -> Iterator[psycopg.Connection[Any]]:
    """The caller's connection as it is, or one of our own (autocommit, password-safe errors)."""
    if isinstance(target, psycopg.Connection):
        yield target
    else:
        with connect(target) as conn:
            yield conn


@contextmanager
def _transaction(conn: psycopg.Connection[Any], joined: bool) -> Iterator[psycopg.Cursor[Any]]:
    """A transaction (a savepoint inside a caller's) and a cursor in it. A transaction of our
    own runs at READ COMMITTED whatever the database's default: a process that waited for the
    lock must see what the winner committed meanwhile, which a REPEATABLE READ snapshot (taken
    by the lock statement) would not, and it would re-run every migration.

    ``joined``: the caller has begun a transaction its driver has not opened yet (SQLAlchemy
    sends BEGIN with the first statement): it is opened here, so that ours nests in it instead
    of committing on its own before the caller's; at READ COMMITTED too, for the same reason,
    unless the caller chose a level. No lock or statement timeout in it (``session.sql``,
    ``migration_timeouts_off``): one set for the application would fail a process waiting for
    another's migration, or a migration building an index on a big table."""
    ours = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if ours and joined and not conn.autocommit:
        chosen = conn.isolation_level is not None
        conn.execute("SELECT 1" if chosen else "SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        ours = False
    with conn.transaction(), conn.cursor() as cur:
        if ours:
            cur.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cur.execute(query("session", "migration_timeouts_off", DEFAULT_SCHEMA).psycopg)
        saved = cur.fetchone()
        yield cur
        if saved is not None:  # a caller's transaction goes on with its own timeouts
            back = query("session", "migration_timeouts_back", DEFAULT_SCHEMA)
            cur.execute(back.psycopg, {"lock_timeout": saved[0], "statement_timeout": saved[1]})


def _bootstrap(cur: psycopg.Cursor[Any], schema: str) -> None:
    ident = sql.Identifier(schema)
    cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"outboxkit.migrate.{schema}",))
    # Only when it is missing: PostgreSQL checks CREATE on the database before IF NOT EXISTS, and
    # a schema's owner needs that privilege the first time only.
    cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
    if cur.fetchone() is None:
        cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
    cur.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.schema_migration ("
            " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        ).format(ident)
    )


def _applied(cur: psycopg.Cursor[Any], schema: str) -> dict[int, str]:
    cur.execute(
        sql.SQL("SELECT version, checksum FROM {}.schema_migration ORDER BY version").format(
            sql.Identifier(schema)
        )
    )
    return {int(v): str(c) for v, c in cur.fetchall()}


def _status(applied: dict[int, str]) -> MigrationStatus:
    known = {m.version: m for m in load_migrations()}
    return MigrationStatus(
        applied=tuple(sorted(applied)),
        pending=tuple(v for v in sorted(known) if v not in applied),
        unknown=tuple(v for v in sorted(applied) if v not in known),
        changed=tuple(v for v in sorted(applied) if v in known and known[v].checksum != applied[v]),
    )


def refuse_unknown(status: MigrationStatus, schema: str) -> None:
    """``upgrade`` (and ``migrate sql``, which prints what it would run) refuse a schema ahead of
    this version or with an edited migration: nothing of ours can bring it to a known state."""
    if status.unknown or status.changed:
        raise SchemaError(
            f"schema {schema!r} has migrations this outboxkit does not know"
            f" (unknown {list(status.unknown)}, changed {list(status.changed)})"
        )


def upgrade(target: Target, schema: str = DEFAULT_SCHEMA, *, joined: bool = False) -> list[int]:
    """Apply every pending migration in one transaction; returns the versions applied.

    On a caller's connection that is inside a transaction (an Alembic revision; ``joined``: one
    begun but not yet opened by the driver) this runs in a savepoint of it, and the
    ``search_path`` the migrations need is put back afterwards.

    On a connection of its own (a URL), a transaction PostgreSQL ends as a deadlock's victim is
    run again, up to :data:`DEADLOCK_RUNS` times in all: several pending migrations hold their
    locks until the one commit, so running relays and consumers (a retention sweep, a handler
    writing outbox rows) can take the same tables in the other order. Nothing was applied, and
    the other side has what it waited for. A caller's transaction is the caller's to run again.
    """
    validate_schema_name(schema)
    runs = 1 if isinstance(target, psycopg.Connection) else DEADLOCK_RUNS
    for run in range(1, runs + 1):
        try:
            return _upgrade(target, schema, joined)
        except (MigrationError, psycopg.errors.DeadlockDetected) as exc:
            cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
            if run == runs or not isinstance(cause, psycopg.errors.DeadlockDetected):
                raise
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            logger.warning(
                "migrate up: %s; nothing applied, running it again (run %d of %d)",
                first_line,
                run + 1,
                runs,
            )
    raise AssertionError("unreachable")


def _upgrade(target: Target, schema: str, joined: bool) -> list[int]:
    with _connect(target) as conn, _transaction(conn, joined) as cur:
        _bootstrap(cur, schema)
        status = _status(_applied(cur, schema))
        refuse_unknown(status, schema)
        if not status.pending:
            return []
        cur.execute("SELECT current_setting('search_path')")
        saved = cur.fetchone()
        cur.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        for migration in load_migrations():
            if migration.version not in status.pending:
                continue
            try:
                cur.execute(migration.sql.encode())
            except psycopg.Error as exc:
                raise MigrationError(
                    f"migration {migration.version:04d}_{migration.name} failed: {exc}"
                ) from exc
            cur.execute(
                "INSERT INTO schema_migration (version, name, checksum) VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.checksum),
            )
        if saved is not None:
            cur.execute("SELECT set_config('search_path', %s, true)", (saved[0],))
        return list(status.pending)


def status(target: Target, schema: str = DEFAULT_SCHEMA) -> MigrationStatus:
    """Applied, pending, unknown and edited versions; leaves a caller's transaction as it was."""
    validate_schema_name(schema)
    with _connect(target) as conn:
        was_idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (f"{schema}.schema_migration",))
            row = cur.fetchone()
            applied = _applied(cur, schema) if row and row[0] else {}
        if was_idle and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()  # only the transaction our reads opened
        return _status(applied)


def require_current(target: Target, schema: str = DEFAULT_SCHEMA) -> None:
    """Refuse to run on a schema this version does not know (behind, ahead, or edited)."""
    current = status(target, schema)
    if not current.is_current:
        raise SchemaError(
            f"schema {schema!r} is not at migration {latest_version()}: pending"
            f" {list(current.pending)}, unknown {list(current.unknown)}, changed"
            f" {list(current.changed)}; {_remedy(current)}",
            status=current,
        )


def _remedy(current: MigrationStatus) -> str:
    """What to do: `migrate up` applies pending migrations only; it refuses a schema with
    unknown or edited ones, so naming it for those would send the user to a second error."""
    if not (current.unknown or current.changed):
        return "run `outboxkit migrate up`"
    fixes = []
    if current.unknown:
        fixes.append("the schema is ahead of this outboxkit: run the newer outboxkit release")
    if current.changed:
        fixes.append(
            "applied migrations differ from this outboxkit's files: run the outboxkit release"
            " that applied them, or restore its migration files"
        )
    return "; ".join(fixes) + " (`outboxkit migrate up` refuses such a schema)"


def render_sql(schema: str = DEFAULT_SCHEMA, after: int = 0) -> str:
    """The SQL ``upgrade`` would run after version ``after``, for DBAs who apply it by hand."""
    ident = quoted(schema)  # as upgrade's sql.Identifier: a reserved word (user) is a name too
    parts = [
        "BEGIN ISOLATION LEVEL READ COMMITTED;",  # as upgrade: see _transaction
        "SET LOCAL lock_timeout = 0;",
        "SET LOCAL statement_timeout = 0;",
        f"SELECT pg_advisory_xact_lock(hashtext('outboxkit.migrate.{schema}'));",
        # (after a first migration the schema exists: no CREATE on the database needed)
        *([f"CREATE SCHEMA IF NOT EXISTS {ident};"] if after == 0 else []),
        f"CREATE TABLE IF NOT EXISTS {ident}.schema_migration (version integer PRIMARY KEY,"
        " name text NOT NULL, checksum text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now());",
        f"SET LOCAL search_path TO {ident};",
    ]
    for m in load_migrations():
        if m.version > after:
            parts.append(f"-- {m.version:04d}_{m.name}\n{m.sql.strip()}")
            parts.append(
                "INSERT INTO schema_migration (version, name, checksum)"
                f" VALUES ({m.version}, '{m.name}', '{m.checksum}');"
            )
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"
