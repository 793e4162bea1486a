"""The writer works under the application role's documented grants, and needs no more.

The grants are those of docs/writes.md ("Database role"): INSERT of the written columns, SELECT
of the columns RETURNING and the idempotency re-read use, SELECT of the shard count, EXECUTE of
the shard function. No DELETE, no UPDATE, no payloads of other writers' rows. With them alone the
role cannot choose ids, and add_many's COPY path reads the ids back; with INSERT of ``id`` and
USAGE of its sequence as well (what ``outboxkit migrate grants`` gives, run here as it is), it
sends them.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from outboxkit import outbox as outbox_module
from outboxkit.db import grants as grant_sql
from outboxkit.errors import IdempotencyKeyConflictError
from outboxkit.events import Message
from outboxkit.outbox import Outbox

pytestmark = pytest.mark.integration

GRANTS = """
GRANT USAGE ON SCHEMA outboxkit TO {role};
GRANT SELECT ON outboxkit.outbox_setting TO {role};
GRANT EXECUTE ON FUNCTION outboxkit.outbox_shard(text, uuid, integer) TO {role};
GRANT INSERT (event_id, idempotency_key, content_digest, topic, message_key, payload,
              content_type, headers, event_type, schema_version, aggregate_type, aggregate_id,
              shard, deliver_after)
    ON outboxkit.outbox_message TO {role};
GRANT SELECT (id, event_id, idempotency_key, content_digest, shard, xact_id)
    ON outboxkit.outbox_message TO {role};
"""
HAS_ID_GRANTS = """SELECT has_column_privilege('outboxkit.outbox_message', 'id', 'INSERT')
    AND has_sequence_privilege('outboxkit.outbox_message_id_seq', 'USAGE')"""


@pytest.fixture(params=["documented", "migrate grants"])
def app_engine(sa_url: str, request: pytest.FixtureRequest) -> Iterator[sa.Engine]:
    """An engine whose connections act as a fresh role holding only the documented grants
    (the second time, those of ``outboxkit migrate grants``, which let add_many's COPY send the
    ids)."""
    role = f"app_{uuid.uuid4().hex[:10]}"
    if request.param == "migrate grants":
        grants = [s.as_string(None) for s in grant_sql.statements("outboxkit", {"app": role})]
    else:
        grants = GRANTS.format(role=role).split(";")
    admin = sa.create_engine(sa_url)
    with admin.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} NOLOGIN"))
        conn.execute(sa.text("REVOKE EXECUTE ON FUNCTION outboxkit.outbox_shard FROM PUBLIC"))
        for statement in grants:
            if statement.strip():
                conn.execute(sa.text(statement))
    engine = sa.create_engine(sa_url)

    @sa.event.listens_for(engine, "connect")
    def become_the_role(dbapi_conn: object, _record: object) -> None:
        with dbapi_conn.cursor() as cur:  # type: ignore[attr-defined]
            cur.execute(f"SET ROLE {role}")
        dbapi_conn.commit()  # type: ignore[attr-defined]

    yield engine
    engine.dispose()
    with admin.begin() as conn:
        conn.execute(sa.text(f"DROP OWNED BY {role}"))
        conn.execute(sa.text(f"DROP ROLE {role}"))
    admin.dispose()


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the writer's statements, in the order it runs them."""
    names: list[str] = []
    execute = outbox_module._execute

    def recording(conn: sa.Connection, schema: str, name: str, params: dict[str, Any]) -> Any:
        names.append(name)
        return execute(conn, schema, name, params)

    monkeypatch.setattr(outbox_module, "_execute", recording)
    return names


@pytest.mark.parametrize("notify", [True, False])
def test_every_write_path_works_under_the_application_role(
    app_engine: sa.Engine, notify: bool, statements: list[str]
) -> None:
    outbox = Outbox(notify=notify)
    copying = Outbox(notify=notify, copy_min_rows=2)  # add_many's COPY path from 2 rows on
    with app_engine.begin() as conn:
        assert conn.execute(sa.text("SELECT current_user")).scalar() != "outboxkit"
        first = outbox.add(conn, Message("t", b"1"), idempotency_key="a")
        again = outbox.add(conn, Message("t", b"1"), idempotency_key="a")
        assert again.duplicate
        assert again.event_id == first.event_id
        many = outbox.add_many(
            conn,
            [Message("t", b"2", idempotency_key="b"), Message("t", b"1", idempotency_key="a")],
        )
        assert [r.duplicate for r in many] == [False, True]
        copied = copying.add_many(conn, [Message("t", b"5"), Message("t", b"6")])
        assert [r.duplicate for r in copied] == [False, False]
        query = sa.text("SELECT event_id, id FROM outboxkit.outbox_message")
        stored: dict[uuid.UUID, int] = dict(list(conn.execute(query)))
        assert [stored[r.event_id] for r in copied] == [r.id for r in copied]
        read_back = "copied_ids" in statements  # how the COPY path learnt the ids
        assert read_back == (not conn.execute(sa.text(HAS_ID_GRANTS)).scalar())
        fell_back = copying.add_many(  # "a" is taken: the COPY fails, ON CONFLICT decides
            conn, [Message("t", b"7"), Message("t", b"1", idempotency_key="a")]
        )
        assert [r.duplicate for r in fell_back] == [False, True]
    with app_engine.connect() as conn:
        with pytest.raises(IdempotencyKeyConflictError):
            outbox.add(conn, Message("t", b"other"), idempotency_key="a")
        with pytest.raises(IdempotencyKeyConflictError):  # undone by ROLLBACK TO SAVEPOINT
            copying.add_many(
                conn,
                [Message("t", b"3", idempotency_key="c"), Message("t", b"x", idempotency_key="b")],
            )
        outbox.add_many(conn, [Message("t", b"3", idempotency_key="c"), Message("t", b"4")])
        conn.commit()
    with app_engine.connect() as conn:
        keys = conn.execute(sa.text("SELECT idempotency_key FROM outboxkit.outbox_message"))
        assert sorted(k for (k,) in keys if len(k) == 1) == ["a", "b", "c"]


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM outboxkit.outbox_message",
        "UPDATE outboxkit.outbox_message SET state = 'discarded'",
        "SELECT payload FROM outboxkit.outbox_message",
        "UPDATE outboxkit.outbox_setting SET shard_count = 2",
        "SELECT * FROM outboxkit.relay_lease",
    ],
)
def test_the_application_role_can_do_nothing_else(app_engine: sa.Engine, statement: str) -> None:
    with app_engine.connect() as conn, pytest.raises(sa.exc.ProgrammingError, match="denied"):
        conn.execute(sa.text(statement))


# Rows a writer could hold other writers' rows back with (a parked row blocks its key's pending
# rows in its shard) or fake the relay's bookkeeping: each column keeps its default.
RELAY_ONLY = [
    ("state", "'parked'"),
    ("attempts", "99"),
    ("published_at", "now()"),
    ("kafka_offset", "1"),
    ("xact_id", "pg_current_xact_id()"),
]


@pytest.mark.parametrize("app_engine", ["migrate grants"], indirect=True)
@pytest.mark.parametrize(("column", "value"), RELAY_ONLY, ids=[c for c, _ in RELAY_ONLY])
def test_the_application_role_cannot_set_the_relays_columns(
    app_engine: sa.Engine, column: str, value: str
) -> None:
    def insert(extra: str, extra_value: str) -> sa.TextClause:
        return sa.text(
            "INSERT INTO outboxkit.outbox_message (event_id, idempotency_key, content_digest,"
            f" topic, message_key, payload, shard{extra}) VALUES (gen_random_uuid(), 'p',"
            f" decode('00', 'hex'), 't', 'k', decode('00', 'hex'), 0{extra_value})"
        )

    with app_engine.connect() as conn:  # the same row, the column left to its default: stored
        conn.execute(insert("", ""))
        conn.rollback()
        with pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            conn.execute(insert(f", {column}", f", {value}"))


@pytest.mark.parametrize("app_engine", ["documented"], indirect=True)
def test_a_role_that_cannot_choose_ids_reads_them_back_by_event_id_past_a_sequence_cache(
    app_engine: sa.Engine, sa_url: str, statements: list[str]
) -> None:
    """Without the id grants the COPY's ids are read back as the range above the highest id
    seen before it; with a sequence cache this session's ids can lie below another session's
    committed row, the range comes back short, and the ids are read back by event id."""
    admin = sa.create_engine(sa_url)

    def cache(size: int) -> None:
        with admin.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE outboxkit.outbox_message ALTER id SET CACHE {size}"))

    outbox, copying = Outbox(), Outbox(copy_min_rows=2)
    cache(50)
    try:
        with app_engine.connect() as mine, app_engine.connect() as other:
            first = outbox.add(mine, Message("t", b"a"))  # takes a cache of 50 ids
            mine.commit()
            theirs = outbox.add(other, Message("t", b"b"))  # the next 50: above ours
            other.commit()
            copied = copying.add_many(mine, [Message("t", str(i).encode()) for i in range(20)])
            mine.commit()
    finally:
        cache(1)
        admin.dispose()
    assert first.id is not None
    assert theirs.id is not None
    assert [w.id for w in copied] == list(range(first.id + 1, first.id + 21))
    assert all(w.id is not None and w.id < theirs.id for w in copied)  # range found none
    assert statements.count("copied_ids") == 1
    assert statements.count("copied_ids_by_event_id") == 1
    with app_engine.connect() as conn:
        query = sa.text("SELECT event_id, id FROM outboxkit.outbox_message")
        stored: dict[uuid.UUID, int] = dict(list(conn.execute(query)))
    assert [stored[w.event_id] for w in copied] == [w.id for w in copied]
