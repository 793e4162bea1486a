"""An item refused while add_many's COPY streams: the server is told a fixed text (it logs
it), never the refusal's, which may quote the item's values; the caller gets its own error."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, cast

import psycopg
import psycopg._copy
import psycopg._copy_async
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from outboxkit.errors import IdempotencyKeyConflictError, InvalidTopicError, SerializationError
from outboxkit.events import Event, Message
from outboxkit.outbox import Outbox

pytestmark = pytest.mark.integration

COPYING = Outbox(copy_min_rows=10)
SECRET = "s3cr3t-TOKEN"
FIXED = "a row was refused before it was sent"


class Leaky(Exception):
    """An application's own error, raised by its event while the COPY streams."""


LEAKY = Leaky(f"lookup failed for {SECRET}")


class Refusing(Event, topic="t", key="order_id"):
    order_id: str

    def outbox_idempotency_key(self) -> str | None:
        raise LEAKY


HEADER = cast(Any, {SECRET: b"x"})  # bytes: refused, the header's name quoted (never a value)
BAD_ITEMS: dict[str, tuple[Any, type[BaseException]]] = {
    "header": (Message("t", b"x", headers=HEADER), SerializationError),
    "topic": (Message(f"{SECRET}!", b"x"), InvalidTopicError),
    # the key of item 3 of the same call, with other content
    "key_reused": (
        Message("t", {"other": 1}, idempotency_key=f"{SECRET}-3"),
        IdempotencyKeyConflictError,
    ),
    "own_error": (Refusing(order_id=SECRET), Leaky),
}


def items(bad: Any) -> list[Any]:
    good = [Message("t", {"n": i}, idempotency_key=f"{SECRET}-{i}") for i in range(30)]
    return [*good[:20], bad, *good[20:]]


@pytest.fixture
def copy_ends(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes | None, str | None]]:
    """What each COPY's end told the server, and the error the server answered with."""
    seen: list[tuple[bytes | None, str | None]] = []
    real = psycopg._copy.copy_end

    def spy(pgconn: Any, error: bytes | None) -> Generator[Any, Any, Any]:
        try:
            result = yield from real(pgconn, error)
        except psycopg.Error as exc:
            seen.append((error, str(exc)))
            raise
        seen.append((error, None))
        return result

    monkeypatch.setattr(psycopg._copy, "copy_end", spy)
    monkeypatch.setattr(psycopg._copy_async, "copy_end", spy)
    return seen


def assert_told_nothing_of_the_item(seen: list[tuple[bytes | None, str | None]]) -> None:
    [(sent, answer)] = seen
    assert sent is not None
    assert answer is not None
    assert FIXED.encode() in sent
    assert FIXED in answer  # the server's "COPY from stdin failed: ..." (what it logs)
    for text in (sent.decode(), answer):
        assert SECRET not in text
        assert "Leaky" not in text  # not even the type of the caller's error


def count(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(sa.text("SELECT count(*) FROM outboxkit.outbox_message")).scalar_one()
        )


@pytest.mark.parametrize(("bad", "error"), BAD_ITEMS.values(), ids=BAD_ITEMS.keys())
def test_the_server_is_told_a_fixed_text(
    engine: sa.Engine,
    copy_ends: list[tuple[bytes | None, str | None]],
    bad: Any,
    error: type[BaseException],
) -> None:
    with engine.connect() as conn:
        with pytest.raises(error) as raised:
            COPYING.add_many(conn, items(bad))
        assert_told_nothing_of_the_item(copy_ends)
        assert SECRET in str(raised.value)  # the caller's error is its own, unchanged
        if error is Leaky:
            assert raised.value is LEAKY
            assert LEAKY.__context__ is None
            assert LEAKY.__cause__ is None
        COPYING.add_many(conn, items(Message("t", b"fine")))  # the transaction goes on
        conn.commit()
    assert count(engine) == 31


@pytest.mark.parametrize(("bad", "error"), BAD_ITEMS.values(), ids=BAD_ITEMS.keys())
async def test_the_server_is_told_a_fixed_text_async(
    aengine: AsyncEngine,
    engine: sa.Engine,
    copy_ends: list[tuple[bytes | None, str | None]],
    bad: Any,
    error: type[BaseException],
) -> None:
    async with aengine.connect() as conn:
        with pytest.raises(error) as raised:
            await COPYING.add_many_async(conn, items(bad))
        assert_told_nothing_of_the_item(copy_ends)
        assert SECRET in str(raised.value)
        if error is Leaky:
            assert raised.value is LEAKY
        await COPYING.add_many_async(conn, items(Message("t", b"fine")))
        await conn.commit()
    assert count(engine) == 31
