"""Behind a real PgBouncer in transaction-pooling mode, as PostgreSQL is often reached in
production: one that keeps no prepared statement across its pool (Debian 12's 1.18, or a later
one with ``max_prepared_statements = 0``), with fewer server connections than the clients open,
so their transactions share them.

With ``prepared_statements = false`` the whole story holds (writers, two relays, the active one
SIGKILLed, a consumer killed between its database commit and its offset commit). Without it,
the pooler's errors are recognised as a setting's (never held against a record by the
consumer's own statements outside a handler's transaction) and say what to change."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from outboxkit.db.availability import POOLER_HINT, database_unavailable
from outboxkit.devstack.pgbouncer import PgBouncer
from outboxkit.inbox.guard import error_text
from tests.support.demo_command import run_demo, verification_table
from tests.support.env import service_env

POOL_SIZE = 2


@pytest.fixture(scope="module")
def pooler(outboxkit_database_url: str) -> Iterator[PgBouncer]:
    bouncer = PgBouncer(outboxkit_database_url, pool_size=POOL_SIZE)
    bouncer.start()
    yield bouncer
    bouncer.destroy()


def _database(db_url: str) -> str:
    return urlsplit(db_url).path.lstrip("/")


def _backends(server_url: str, database: str) -> int:
    with psycopg.connect(server_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = %s AND backend_type = 'client backend'",  # no autovacuum worker
            (database,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_demo_holds_behind_a_transaction_pooler(
    pooler: PgBouncer,
    outboxkit_database_url: str,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    database = _database(outboxkit_db_url)
    env = service_env(
        pooler.url_for(database),
        outboxkit_kafka_bootstrap,
        OUTBOXKIT_DATABASE_PREPARED_STATEMENTS="false",
    )
    verification_table(run_demo(env, tmp_path))
    logs = "".join(p.read_text() for p in tmp_path.glob("*.log"))
    assert "prepared statement" not in logs
    # The writers, the two relays, the consumer and the demo's own sampler, each with
    # connections of its own, shared POOL_SIZE server connections: their transactions went
    # through the pooler's pool.
    assert 0 < _backends(outboxkit_database_url, database) <= POOL_SIZE


def test_a_prepared_statement_the_pooler_lost_is_no_records_fault_and_says_what_to_change(
    outboxkit_database_url: str, outboxkit_db_url: str
) -> None:
    """Two clients of a pool of one server connection: psycopg names the first statement each
    prepares ``_pg3_0`` (as it does a statement run 5 times), on the same server connection."""
    bouncer = PgBouncer(outboxkit_database_url, pool_size=1)
    bouncer.start()
    try:
        url = bouncer.url_for(_database(outboxkit_db_url))
        with psycopg.connect(url) as first, psycopg.connect(url) as second:
            first.execute("SELECT 1", prepare=True)
            first.commit()  # the server connection goes back to the pool, the statement stays
            with pytest.raises(psycopg.errors.DuplicatePreparedStatement) as caught:
                second.execute("SELECT 2", prepare=True)
    finally:
        bouncer.destroy()
    assert database_unavailable(caught.value)  # retried, never given up for the record
    text = error_text(caught.value)
    assert "SQLSTATE 42P05" in text
    assert POOLER_HINT in text
    assert "prepared_statements = false" in text


def test_a_prepared_statement_that_does_not_exist_is_no_records_fault_either(
    outboxkit_db_url: str,
) -> None:
    with (
        psycopg.connect(outboxkit_db_url, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InvalidSqlStatementName) as caught,
    ):
        conn.execute("EXECUTE _pg3_0")
    assert database_unavailable(caught.value)
    assert POOLER_HINT in error_text(caught.value)
