"""Migration 0005 (the discarded rows' index) keeps an index an operator built concurrently
beforehand, and builds again one that failed or is defined otherwise, as 0004 does."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

from outboxkit.db import migrator
from outboxkit.schema import quoted
from tests.support.indexes import index_of

pytestmark = pytest.mark.integration

NAME = "outbox_message_discarded_idx"
DEFINITION = (
    f"CREATE INDEX {NAME} ON outbox_message USING btree (shard, id)"
    " WHERE (state = 'discarded'::text)"
)
SCHEMAS = ["outboxkit", "user"]  # "user": a reserved word, quoted everywhere


def _at_0004(url: str, schema: str) -> None:
    """The schema as 0004 left it: the rendered migrations up to 0005, applied as psql would."""
    head, found, _ = migrator.render_sql(schema).partition("\n-- 0005_")
    assert found
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute((head + "\nCOMMIT;\n").encode())
    assert migrator.status(url, schema).pending[0] == 5
    assert _index(url, schema) is None


def _index(url: str, schema: str) -> tuple[int, str, bool] | None:
    return index_of(url, schema, NAME)


def _build(conn: psycopg.Connection, schema: str, columns: str) -> None:
    conn.execute(
        f"CREATE INDEX CONCURRENTLY {NAME} ON {quoted(schema)}.outbox_message {columns}"
        " WHERE state = 'discarded'"
    )


@pytest.mark.parametrize("schema", SCHEMAS)
def test_0005_builds_the_index(outboxkit_empty_db_url: str, schema: str) -> None:
    _at_0004(outboxkit_empty_db_url, schema)
    assert migrator.upgrade(outboxkit_empty_db_url, schema)[0] == 5
    built = _index(outboxkit_empty_db_url, schema)
    assert built is not None
    assert built[1:] == (DEFINITION, True)


def test_0005_keeps_an_index_an_operator_built_concurrently(outboxkit_empty_db_url: str) -> None:
    url = outboxkit_empty_db_url
    _at_0004(url, "outboxkit")
    with psycopg.connect(url, autocommit=True) as conn:
        _build(conn, "outboxkit", "(shard, id)")
    built = _index(url, "outboxkit")
    assert built is not None
    assert migrator.upgrade(url)[0] == 5
    assert _index(url, "outboxkit") == built  # the same index (oid): not built again


def _failed_build(url: str, schema: str) -> None:
    """A build waits for the table's open writes; one cut short by lock_timeout (as by a
    cancel) leaves its index behind, invalid, under the name."""
    with psycopg.connect(url) as writer, psycopg.connect(url, autocommit=True) as conn:
        writer.execute(
            f"INSERT INTO {quoted(schema)}.outbox_message"
            " (event_id, idempotency_key, content_digest, topic, payload)"
            " VALUES (gen_random_uuid(), 'k', '\\x00', 't', '\\x7b7d')"
        )
        conn.execute("SET lock_timeout = '100ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            _build(conn, schema, "(shard, id)")
        writer.rollback()


def _other_build(url: str, schema: str) -> None:
    """Valid, but of other columns: it would not serve the sweep's shard condition."""
    with psycopg.connect(url, autocommit=True) as conn:
        _build(conn, schema, "(id)")


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("broken", [_failed_build, _other_build], ids=["failed", "other"])
def test_0005_rebuilds_a_failed_or_different_index_of_the_same_name(
    outboxkit_empty_db_url: str, schema: str, broken: Callable[[str, str], None]
) -> None:
    """IF NOT EXISTS alone would keep either."""
    url = outboxkit_empty_db_url
    _at_0004(url, schema)
    broken(url, schema)
    found = _index(url, schema)
    assert found is not None
    assert found[1:] != (DEFINITION, True)
    assert migrator.upgrade(url, schema)[0] == 5
    rebuilt = _index(url, schema)
    assert rebuilt is not None
    assert rebuilt[1:] == (DEFINITION, True)
