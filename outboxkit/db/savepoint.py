"""A savepoint on the caller's transaction: undo our own statements without DELETE.

``add_many`` writes its rows inside one, so a conflict found after the insert rolls back exactly
this call's rows (``ROLLBACK TO SAVEPOINT``) and the caller's transaction carries on as it was.
The application's database role then needs no DELETE on the outbox table. The savepoint is
always released before the block returns or raises, so nothing of it is left to the caller.

A released savepoint that wrote rows still holds a subtransaction id until the transaction
ends; PostgreSQL caches 64 per transaction, so callers should not open hundreds in one.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from outboxkit.db.execute import AsyncTarget, SyncTarget, run, run_async
from outboxkit.db.queries import Query

logger = logging.getLogger("outboxkit.db")

_NAME = "outboxkit_write"
SAVEPOINT = Query("db", "savepoint", f"SAVEPOINT {_NAME}")
RELEASE = Query("db", "release_savepoint", f"RELEASE SAVEPOINT {_NAME}")
ROLLBACK_TO = Query("db", "rollback_to_savepoint", f"ROLLBACK TO SAVEPOINT {_NAME}")


@contextmanager
def savepoint(target: SyncTarget) -> Iterator[None]:
    """Run the block in a savepoint: released on success; on any exception rolled back to
    (and released), then the exception goes on."""
    run(target, SAVEPOINT)
    try:
        yield
    except BaseException:
        try:
            run(target, ROLLBACK_TO)
            run(target, RELEASE)
        except Exception:  # a broken connection: the original error is the one to see
            logger.debug("could not roll back to the savepoint", exc_info=True)
        raise
    run(target, RELEASE)


@asynccontextmanager
async def savepoint_async(target: AsyncTarget) -> AsyncIterator[None]:
    """:func:`savepoint` for async targets."""
    await run_async(target, SAVEPOINT)
    try:
        yield
    except BaseException:
        try:
            await run_async(target, ROLLBACK_TO)
            await run_async(target, RELEASE)
        except Exception:
            logger.debug("could not roll back to the savepoint", exc_info=True)
        raise
    await run_async(target, RELEASE)


def rollback_to_savepoint(target: SyncTarget) -> None:
    """Undo everything since the open savepoint (which stays open), e.g. a failed COPY."""
    run(target, ROLLBACK_TO)


async def rollback_to_savepoint_async(target: AsyncTarget) -> None:
    await run_async(target, ROLLBACK_TO)
