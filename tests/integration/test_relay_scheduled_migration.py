"""Migration 0008 (scheduled rows): the schedule index kept when an operator built it
concurrently beforehand, built again when it is invalid or defined otherwise (as 0005 does);
the new state accepted, existing rows checked, and rows scheduled before the upgrade moved by
the relay afterwards."""

from __future__ import annotations

import psycopg
import pytest

from outboxkit.db import migrator
from outboxkit.schema import quoted
from tests.support.indexes import index_of

pytestmark = pytest.mark.integration

NAME = "outbox_message_schedule_idx"
DEFINITION = (
    f"CREATE INDEX {NAME} ON outbox_message USING btree (shard, state, deliver_after)"
    " WHERE ((state = 'scheduled'::text) OR ((state = 'pending'::text)"
    " AND (deliver_after IS NOT NULL)))"
)
PREDICATE = "WHERE state = 'scheduled' OR (state = 'pending' AND deliver_after IS NOT NULL)"


def _at_0007(url: str, schema: str) -> None:
    head, found, _ = migrator.render_sql(schema).partition("\n-- 0008_")
    assert found
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute((head + "\nCOMMIT;\n").encode())
        conn.execute(
            f"INSERT INTO {quoted(schema)}.outbox_message"
            " (event_id, idempotency_key, content_digest, topic, payload, deliver_after)"
            " VALUES (gen_random_uuid(), 'later', '\\x00', 't', '\\x7b7d',"
            " now() + interval '1 day')"
        )
    assert migrator.status(url, schema).pending[0] == 8


def _index(url: str, schema: str) -> tuple[int, str, bool] | None:
    return index_of(url, schema, NAME)


def _build(url: str, schema: str, columns: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE INDEX CONCURRENTLY {NAME} ON {quoted(schema)}.outbox_message {columns}"
            f" {PREDICATE}"
        )


@pytest.mark.parametrize("schema", ["outboxkit", "user"])
def test_0008_builds_the_index_and_takes_the_new_state(
    outboxkit_empty_db_url: str, schema: str
) -> None:
    url = outboxkit_empty_db_url
    _at_0007(url, schema)
    assert migrator.upgrade(url, schema)[0] == 8
    built = _index(url, schema)
    assert built is not None
    assert built[1:] == (DEFINITION, True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"UPDATE {quoted(schema)}.outbox_message SET state = 'scheduled'")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(f"UPDATE {quoted(schema)}.outbox_message SET state = 'later'")
        validated = conn.execute(
            "SELECT convalidated FROM pg_constraint WHERE conname = 'outbox_message_state_check'"
            " AND conrelid = %s::regclass",
            (f"{quoted(schema)}.outbox_message",),
        ).fetchone()
    assert validated == (True,)  # a NOT VALID constraint makes SQLAlchemy's reflection warn


def test_0008_keeps_an_index_an_operator_built_concurrently(outboxkit_empty_db_url: str) -> None:
    url = outboxkit_empty_db_url
    _at_0007(url, "outboxkit")
    _build(url, "outboxkit", "(shard, state, deliver_after)")
    built = _index(url, "outboxkit")
    assert built is not None
    assert migrator.upgrade(url)[0] == 8
    assert _index(url, "outboxkit") == built  # the same index (oid): not built again


def test_0008_rebuilds_an_index_of_the_same_name_defined_otherwise(
    outboxkit_empty_db_url: str,
) -> None:
    url = outboxkit_empty_db_url
    _at_0007(url, "outboxkit")
    _build(url, "outboxkit", "(shard, deliver_after)")
    assert migrator.upgrade(url)[0] == 8
    rebuilt = _index(url, "outboxkit")
    assert rebuilt is not None
    assert rebuilt[1:] == (DEFINITION, True)


def test_0008_replaces_a_state_check_of_another_name(outboxkit_empty_db_url: str) -> None:
    """A table built otherwise (by hand, a naming convention) may name its check differently:
    left behind, it would refuse every move of the relay, and the shard would publish nothing."""
    url = outboxkit_empty_db_url
    _at_0007(url, "outboxkit")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE outboxkit.outbox_message"
            " RENAME CONSTRAINT outbox_message_state_check TO ck_outbox_message_state"
        )
    assert migrator.upgrade(url)[0] == 8
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE outboxkit.outbox_message SET state = 'scheduled'")
        names = conn.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'c'"
            " AND conrelid = 'outboxkit.outbox_message'::regclass"
        ).fetchall()
    assert names == [("outbox_message_state_check",)]
