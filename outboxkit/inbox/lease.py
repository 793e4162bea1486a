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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
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


@dataclass
class _Lease:
    event_id: str
    token: int
    due: float
    lost: _LostFlag = field(default_factory=_LostFlag)


class LeaseRenewer:
    """One long-lived thread per sync inbox renewing the lease of the handler running now.

    A thread per message would cost more than a short handler; this one sleeps until the
    current lease is a third of its time old, so fast handlers never cause a renewal at all.
    """

    def __init__(self, store: InboxStore) -> None:
        self.store = store
        self.interval = max(store.lease_seconds / 3, 0.05)
        self._cond = threading.Condition()
        self._current: _Lease | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextmanager
    def keep(self, event_id: str, token: int) -> Iterator[_LostFlag]:
        lease = _Lease(event_id, token, time.monotonic() + self.interval)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="outboxkit-inbox-lease", daemon=True
                )
                self._thread.start()
            self._current = lease
            self._cond.notify()
        try:
            yield lease.lost
        finally:
            with self._cond:
                self._current = None
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                lease = self._current
                if lease is None or lease.lost.reason() is not None:
                    self._cond.wait()  # until the next lease (or close)
                    continue
                wait = lease.due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                lease.due = time.monotonic() + self.interval
                self._cond.release()
                try:
                    problem = self._renew(lease)
                finally:
                    self._cond.acquire()
                if problem is not None:
                    lease.lost.mark(problem)  # nothing more to renew for this lease

    def _renew(self, lease: _Lease) -> str | None:
        try:
            renewed = self.store.renew(lease.event_id, lease.token)
        except Exception as exc:
            logger.warning("lease renewal for %s failed: %s", lease.event_id, exc)
            return f"renewal failed: {exc}"
        return None if renewed else "renewal refused (cancelled or claimed by a newer delivery)"


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
