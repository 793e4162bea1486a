"""Input the writer must refuse rather than write wrong, on every path (add; add_many's INSERT;
its COPY), sync and async, against the real PostgreSQL: a typed error, nothing written, the
caller's transaction still usable.

- A ``deliver_after`` whose tzinfo raises when asked for its offset: before, the tzinfo's own
  exception escaped ``add`` untyped.
- A dict payload with keys JSON writes alike (``1`` and ``"1"``): before, written with the key
  twice (a reader keeps one value).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, tzinfo
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from outboxkit.errors import ValidationError
from outboxkit.events import Message
from outboxkit.outbox import Outbox, OutboxConfig
from tests.relay_support import row_states

pytestmark = pytest.mark.integration

OUTBOX = Outbox(OutboxConfig(copy_min_rows=100))
PATHS = {"one": 1, "insert": 3, "copy": 150}  # add; add_many below and above copy_min_rows


class _Failing(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        raise RuntimeError("the zone database is gone")


HOSTILE: dict[str, tuple[Callable[[], Message], str]] = {
    "tzinfo": (
        lambda: Message("t", {"n": -1}, deliver_after=datetime(2030, 1, 1, tzinfo=_Failing())),
        "deliver_after",
    ),
    "keys": (lambda: Message("t", {"n": {1: "a", "1": "b"}}), "same object key"),
}


def _items(count: int, hostile: str) -> list[Message]:
    """``count`` messages, the hostile one last (the COPY has sent the others by then)."""
    fine = [Message("t", {"n": n}, idempotency_key=f"i-{n}") for n in range(count - 1)]
    return [*fine, HOSTILE[hostile][0]()]


def _write(target: Any, items: list[Message]) -> Any:
    return OUTBOX.add(target, items[0]) if len(items) == 1 else OUTBOX.add_many(target, items)


async def _write_async(target: Any, items: list[Message]) -> Any:
    if len(items) == 1:
        return await OUTBOX.add_async(target, items[0])
    return await OUTBOX.add_many_async(target, items)


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("count", PATHS.values(), ids=PATHS)
def test_hostile_input_is_refused_typed_and_nothing_is_written(
    engine: sa.Engine, outboxkit_db_url: str, count: int, hostile: str
) -> None:
    with engine.connect() as conn:
        with pytest.raises(ValidationError, match=HOSTILE[hostile][1]):
            _write(conn, _items(count, hostile))
        conn.execute(sa.text("SELECT 1"))  # the transaction goes on
        conn.commit()
    assert row_states(outboxkit_db_url) == {}


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("count", PATHS.values(), ids=PATHS)
async def test_hostile_input_is_refused_typed_and_nothing_is_written_async(
    aengine: AsyncEngine, outboxkit_db_url: str, count: int, hostile: str
) -> None:
    async with aengine.connect() as conn:
        with pytest.raises(ValidationError, match=HOSTILE[hostile][1]):
            await _write_async(conn, _items(count, hostile))
        await conn.execute(sa.text("SELECT 1"))
        await conn.commit()
    assert row_states(outboxkit_db_url) == {}
