"""Keeps running handlers' leases alive by token, and tells a handler when its lease is gone.

:class:`LeaseSchedule` decides (pure): a lease is renewed every ``lease_seconds / 3`` in a
statement of its own; a renewal that matches no row (a newer claim took the event over, or an
operator cancelled it) or fails (database unreachable) marks the lease lost, and it is not
renewed again. The handler sees it through ``HandlerContext.check()``; the final ``succeeded``
update is conditional on the token anyway, so a handler that never checks is still fenced.

The drivers only wait and run statements: one long-lived thread per sync inbox
(:class:`LeaseThread`), one task per async inbox (:class:`LeaseTask`). A fast handler never
causes a renewal at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from outboxkit.db.abandon import STATEMENT_GRACE_SECONDS
from outboxkit.inbox.guard import error_text
from outboxkit.inbox.steps import Plan, Sleep, Sql, TableExecutor, drive_async, drive_sync
from outboxkit.inbox.store import InboxStatements

logger = logging.getLogger("outboxkit.inbox.lease")

REFUSED = "renewal refused (cancelled or claimed by a newer delivery)"


class LeaseHandle:
    """One delivery's lease: when it is due for renewal, and why it was lost (if it was)."""

    __slots__ = ("_reason", "due", "event_id", "token")

    def __init__(self, event_id: str, token: int, due: float) -> None:
        self.event_id = event_id
        self.token = token
        self.due = due
        self._reason: str | None = None

    def reason(self) -> str | None:
        return self._reason

    def mark(self, reason: str) -> None:
        if self._reason is None:
            self._reason = reason


class LeaseSchedule:
    """Which lease to renew when, and what a renewal's result means (no IO, no threads)."""

    def __init__(
        self, statements: InboxStatements, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.statements = statements
        self.clock = clock
        self.interval = max(statements.lease_seconds / 3, 0.05)
        self._active: dict[int, LeaseHandle] = {}

    def begin(self, event_id: str, token: int) -> LeaseHandle:
        handle = LeaseHandle(event_id, token, self.clock() + self.interval)
        self._active[id(handle)] = handle
        return handle

    def end(self, handle: LeaseHandle) -> None:
        self._active.pop(id(handle), None)

    def keep(self, stopped: Callable[[], bool]) -> Plan[None]:
        """Renew each live lease when due; sleep in between (at most one interval, so a lease
        begun meanwhile, due one interval after its start, is never renewed late)."""
        while not stopped():
            now = self.clock()
            live = [h for h in list(self._active.values()) if h.reason() is None]
            handle = min(live, key=lambda h: h.due, default=None)
            if handle is None or handle.due > now:
                wait = self.interval if handle is None else handle.due - now
                yield Sleep(min(wait, self.interval))
                continue
            handle.due = now + self.interval
            try:
                renewed = yield self.statements.renew(handle.event_id, handle.token)
            except Exception as exc:
                text = error_text(exc)
                logger.warning("lease renewal for %s failed: %s", handle.event_id, text)
                handle.mark(f"renewal failed: {text}")
                continue
            if renewed.rowcount != 1:
                handle.mark(REFUSED)


class _Keeper:
    """What both drivers share: a lease begins once the driver runs (``_start``)."""

    schedule: LeaseSchedule

    def _start(self) -> None:
        raise NotImplementedError

    def begin(self, event_id: str, token: int) -> LeaseHandle:
        self._start()
        return self.schedule.begin(event_id, token)

    def begin_all(self, claims: Iterable[tuple[str, int]]) -> list[LeaseHandle]:
        """:meth:`begin` for each ``(event_id, token)`` of a batch (the driver checked once)."""
        self._start()
        return [self.schedule.begin(event_id, token) for event_id, token in claims]


class LeaseThread(_Keeper):
    """The sync driver: one daemon thread, started with the first lease."""

    def __init__(self, schedule: LeaseSchedule, run_sql: Callable[[Sql], Any]) -> None:
        self.schedule = schedule
        self._closed = threading.Event()
        self._execute = TableExecutor({Sql: run_sql, Sleep: lambda s: self._closed.wait(s.seconds)})
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="outboxkit-inbox-lease", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        try:
            drive_sync(self.schedule.keep(self._closed.is_set), self._execute)
        except Exception:  # pragma: no cover - the plan catches statement errors itself
            logger.exception("lease keeper stopped")

    def close(self) -> None:
        """Waits for the thread, at most the statement grace: one still opening a connection
        to a server that does not answer ends by itself at its connect timeout (a daemon, it
        renews nothing more once closed)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(STATEMENT_GRACE_SECONDS)


def _never() -> bool:
    return False


class LeaseTask(_Keeper):
    """The async driver: one task, started with the first lease in the running event loop."""

    def __init__(self, schedule: LeaseSchedule, run_sql: Callable[[Sql], Any]) -> None:
        self.schedule = schedule
        self._execute = TableExecutor({Sql: run_sql, Sleep: lambda s: asyncio.sleep(s.seconds)})
        self._task: asyncio.Task[None] | None = None

    def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._task = loop.create_task(
                drive_async(self.schedule.keep(_never), self._execute),
                name="outboxkit-inbox-lease",
            )

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
