"""Keeps a running handler's lease alive by token, and tells the handler when it is gone.

The keeper renews every ``lease_seconds / 3`` in its own short transaction. A renewal that
matches no row (a newer claim took the event over, or an operator cancelled it) or fails
(database unreachable) marks the lease lost; so does a revocation of the partition reported by
the adapter. The handler sees it through ``HandlerContext.check()``; the final ``succeeded``
update is conditional on the token anyway, so a handler that never checks is still fenced.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from types import TracebackType

from outboxkit.inbox.store import AsyncInboxStore, InboxStore

logger = logging.getLogger("outboxkit.inbox.lease")


class _LostFlag:
    def __init__(self) -> None:
        self._reason: str | None = None
        self._lock = threading.Lock()

    def mark(self, reason: str) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason

    def reason(self) -> str | None:
        return self._reason


class LeaseKeeper:
    """Background thread renewing one event's lease (sync adapter)."""

    def __init__(self, store: InboxStore, event_id: str, token: int) -> None:
        self.store = store
        self.event_id = event_id
        self.token = token
        self.lost = _LostFlag()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="outboxkit-inbox-lease", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        interval = max(self.store.lease_seconds / 3, 0.05)
        while not self._stop.wait(interval):
            try:
                renewed = self.store.renew(self.event_id, self.token)
            except Exception as exc:
                logger.warning("lease renewal for %s failed: %s", self.event_id, exc)
                self.lost.mark(f"renewal failed: {exc}")
                return
            if not renewed:
                self.lost.mark("renewal refused (cancelled or claimed by a newer delivery)")
                return


class AsyncLeaseKeeper:
    """Background task renewing one event's lease (async adapter)."""

    def __init__(self, store: AsyncInboxStore, event_id: str, token: int) -> None:
        self.store = store
        self.event_id = event_id
        self.token = token
        self.lost = _LostFlag()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AsyncLeaseKeeper:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        interval = max(self.store.lease_seconds / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            try:
                renewed = await self.store.renew(self.event_id, self.token)
            except Exception as exc:
                logger.warning("lease renewal for %s failed: %s", self.event_id, exc)
                self.lost.mark(f"renewal failed: {exc}")
                return
            if not renewed:
                self.lost.mark("renewal refused (cancelled or claimed by a newer delivery)")
                return
