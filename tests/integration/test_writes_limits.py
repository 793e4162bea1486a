"""What the writer refuses so that the relay never meets a row it cannot park or send, on the
real PostgreSQL: keys too long for the parked rows' index, headers named like the relay's."""

from __future__ import annotations

import random

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from outboxkit.errors import SerializationError, ValidationError
from outboxkit.events import Message
from outboxkit.limits import MESSAGE_KEY_MAX_BYTES
from outboxkit.outbox import Outbox

pytestmark = pytest.mark.integration

INSERTING = Outbox(copy_min_rows=None)
COPYING = Outbox(copy_min_rows=10)


def incompressible(size: int) -> str:
    """``size`` UTF-8 bytes of random 3-byte characters (and ASCII to fill): PostgreSQL's
    compression of index entries gains nothing on them."""
    rng = random.Random(size)
    text = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(size // 3))
    return text + "k" * (size % 3)


def stored_keys(engine: sa.Engine) -> list[str | None]:
    with engine.connect() as conn:
        query = sa.text("SELECT message_key FROM outboxkit.outbox_message ORDER BY id")
        return list(conn.execute(query).scalars())


_PARK = sa.text("UPDATE outboxkit.outbox_message SET state = 'parked' WHERE message_key = :key")

BAD = [
    pytest.param(
        Message("t", b"x", key=incompressible(3000)), ValidationError, "message key", id="long key"
    ),
    pytest.param(
        Message("t", b"x", headers={"aggregate-id": "\ud800"}),
        SerializationError,
        "lone surrogate",
        id="surrogate in a sent relay-named header",
    ),
    pytest.param(
        Message("t", b"x", headers={"event-id": "\ud800"}),
        SerializationError,
        "lone surrogate",
        id="surrogate in a replaced relay-named header",
    ),
]


@pytest.mark.parametrize(("bad", "error", "problem"), BAD)
def test_refused_on_every_path_and_nothing_written(
    engine: sa.Engine, bad: Message, error: type, problem: str
) -> None:
    """add, add_many as an INSERT and as a COPY: the error, nothing of the call kept, and the
    transaction still usable."""
    fine = [Message("t", b"fine", key=f"k-{i}") for i in range(20)]
    with engine.connect() as conn:
        with pytest.raises(error, match=problem):
            INSERTING.add(conn, bad)
        with pytest.raises(error, match=problem):
            INSERTING.add_many(conn, [*fine, bad])
        with pytest.raises(error, match=problem):
            COPYING.add_many(conn, [*fine, bad])
        INSERTING.add(conn, Message("t", b"fine", key="after"))
        conn.commit()
    assert stored_keys(engine) == ["after"]


@pytest.mark.parametrize(("bad", "error", "problem"), BAD)
async def test_refused_async_and_nothing_written(
    aengine: AsyncEngine, engine: sa.Engine, bad: Message, error: type, problem: str
) -> None:
    fine = [Message("t", b"fine", key=f"k-{i}") for i in range(20)]
    async with aengine.connect() as conn:
        with pytest.raises(error, match=problem):
            await INSERTING.add_async(conn, bad)
        with pytest.raises(error, match=problem):
            await INSERTING.add_many_async(conn, [*fine, bad])
        with pytest.raises(error, match=problem):
            await COPYING.add_many_async(conn, [*fine, bad])
        await INSERTING.add_async(conn, Message("t", b"fine", key="after"))
        await conn.commit()
    assert stored_keys(engine) == ["after"]


def test_a_key_at_the_limit_can_be_parked_one_past_the_index_limit_cannot(
    engine: sa.Engine,
) -> None:
    """Why the limit: the relay parks a row by setting its state, which indexes its key; a key
    PostgreSQL cannot index makes that update fail (and the relay claim the row for ever). The
    longest key the writer takes parks; one over the btree limit, written behind its back,
    does not; the writer refuses it."""
    at_limit = incompressible(MESSAGE_KEY_MAX_BYTES)
    assert len(at_limit.encode()) == MESSAGE_KEY_MAX_BYTES
    too_long = incompressible(3000)
    with engine.connect() as conn:
        INSERTING.add(conn, Message("t", b"x", key=at_limit))
        assert conn.execute(_PARK, {"key": at_limit}).rowcount == 1
        conn.execute(
            sa.text(
                "INSERT INTO outboxkit.outbox_message"
                " (event_id, idempotency_key, content_digest, topic, message_key, payload)"
                " VALUES (gen_random_uuid(), 'raw', '\\x00', 't', :key, '\\x00')"
            ),
            {"key": too_long},
        )
        with pytest.raises(sa.exc.OperationalError) as info:
            conn.execute(_PARK, {"key": too_long})
        assert isinstance(info.value.orig, psycopg.errors.ProgramLimitExceeded)
        conn.rollback()
        with pytest.raises(ValidationError, match="message key is 3000 bytes"):
            INSERTING.add(conn, Message("t", b"x", key=too_long))
