"""Migration 0009 (held rows): the held index kept when an operator built it concurrently
beforehand, built again when it is defined otherwise (as 0005 and 0008 do); the new state
accepted, every other still refused."""

from __future__ import annotations

import psycopg
import pytest

from outboxkit.db import migrator
from outboxkit.schema import quoted
from tests.support.indexes import index_of

pytestmark = pytest.mark.integration

NAME = "outbox_message_held_idx"
DEFINITION = (
    f"CREATE INDEX {NAME} ON outbox_message USING btree (shard, message_key, id)"
    " WHERE (state = 'held'::text)"
)


def _at_0008(url: str, schema: str) -> None:
    head, found, _ = migrator.render_sql(schema).partition("\n-- 0009_")
    assert found
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute((head + "\nCOMMIT;\n").encode())
        conn.execute(
            f"INSERT INTO {quoted(schema)}.outbox_message"
            " (event_id, idempotency_key, content_digest, topic, message_key, payload)"
            " VALUES (gen_random_uuid(), 'behind', '\\x00', 't', 'k', '\\x7b7d')"
        )
    assert migrator.status(url, schema).pending[0] == 9


def _build(url: str, columns: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE INDEX CONCURRENTLY {NAME} ON outboxkit.outbox_message {columns}"
            " WHERE state = 'held'"
        )


@pytest.mark.parametrize("schema", ["outboxkit", "user"])
def test_0009_builds_the_index_and_takes_the_new_state(
    outboxkit_empty_db_url: str, schema: str
) -> None:
    url = outboxkit_empty_db_url
    _at_0008(url, schema)
    assert migrator.upgrade(url, schema)[0] == 9
    built = index_of(url, schema, NAME)
    assert built is not None
    assert built[1:] == (DEFINITION, True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE {quoted(schema)}.outbox_message SET state = 'held'")
        conn.execute(f"UPDATE {quoted(schema)}.outbox_message SET state = 'scheduled'")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(f"UPDATE {quoted(schema)}.outbox_message SET state = 'waiting'")


def test_0009_keeps_an_index_an_operator_built_concurrently(outboxkit_empty_db_url: str) -> None:
    url = outboxkit_empty_db_url
    _at_0008(url, "outboxkit")
    _build(url, "(shard, message_key, id)")
    built = index_of(url, "outboxkit", NAME)
    assert built is not None
    assert migrator.upgrade(url)[0] == 9
    assert index_of(url, "outboxkit", NAME) == built  # the same index (oid): not built again


def test_0009_rebuilds_an_index_of_the_same_name_defined_otherwise(
    outboxkit_empty_db_url: str,
) -> None:
    url = outboxkit_empty_db_url
    _at_0008(url, "outboxkit")
    _build(url, "(shard, message_key)")
    assert migrator.upgrade(url)[0] == 9
    rebuilt = index_of(url, "outboxkit", NAME)
    assert rebuilt is not None
    assert rebuilt[1:] == (DEFINITION, True)
