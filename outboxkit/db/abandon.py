"""Statements a stopping process cannot wait for, ended.

A PostgreSQL that stopped answering (its processes frozen, a network partition that sends no
reset) holds a statement's wait for as long as the TCP connection lives: hours. A stop that
waits for it does not end; cancelling the wait does not help either, as psycopg then asks that
same server to cancel the statement (up to 5 s) and waits 5 s more for the answer. So our
processes give statements in flight :data:`STATEMENT_GRACE_SECONDS` after a stop, then shut the
sockets of the connections still waiting: each wait ends at once with an ``OperationalError``
and the server rolls the transaction back when it notices (nothing was committed, so the work
comes again, as after a crash). From then on no new connection is opened (a server that does
not answer would hold its start for the connect timeout): each attempt fails at once.

Each connection is tracked with a duplicate of its socket's descriptor, taken when it opened:
shutting the duplicate down reaches that connection's socket and no other, even if the
connection closed meanwhile and its descriptor number went to a new socket (a Kafka client's).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

logger = logging.getLogger("outboxkit.db")

#: Seconds a stopping process waits for its statements in flight before it ends them.
STATEMENT_GRACE_SECONDS = 5.0
_TICK = 0.25


class OpenConnections:
    """The psycopg connections (sync or async) of one process, for :meth:`abandon_busy`.

    Thread-safe: connections are tracked by whichever thread opens them and abandoned by a
    watchdog thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[tuple[weakref.ref[Any], socket.socket]] = []
        self.refusing = False  # set once the stop's grace is over: no new connection

    def check_new(self) -> None:
        """Raise if no new connection may be opened (called before each connect)."""
        if self.refusing:
            raise psycopg.OperationalError(
                "no new database connection: the process is stopping and PostgreSQL did not"
                " answer its statements in flight"
            )

    def track(self, conn: Any) -> None:
        """Track a psycopg ``Connection`` or ``AsyncConnection`` until it closes."""
        duplicate = socket.socket(fileno=os.dup(conn.pgconn.socket))
        with self._lock:
            self._prune()
            self._held.append((weakref.ref(conn), duplicate))

    def __len__(self) -> int:
        with self._lock:
            self._prune()
            return len(self._held)

    def prune(self) -> None:
        """Let go of the connections closed meanwhile (their duplicates keep their sockets)."""
        with self._lock:
            self._prune()

    def abandon_busy(self) -> int:
        """Shut the socket of every connection with a statement in flight; returns how many."""
        ended = 0
        with self._lock:
            self._prune()
            kept = []
            for ref, duplicate in self._held:
                conn = ref()
                if conn is not None and conn.pgconn.transaction_status == TransactionStatus.ACTIVE:
                    with contextlib.suppress(OSError):
                        duplicate.shutdown(socket.SHUT_RDWR)
                    duplicate.close()
                    ended += 1
                else:
                    kept.append((ref, duplicate))
            self._held = kept
        return ended

    def close(self) -> None:
        """Stop tracking (the connections themselves stay as they are)."""
        with self._lock:
            for _, duplicate in self._held:
                duplicate.close()
            self._held = []

    def _prune(self) -> None:
        """Drop (and close the duplicate of) every connection gone or closed."""
        kept = []
        for ref, duplicate in self._held:
            conn = ref()
            if conn is None or conn.closed:
                duplicate.close()
            else:
                kept.append((ref, duplicate))
        self._held = kept


class StopWatchdog:
    """A thread that ends the statements of ``connections`` still waiting ``grace`` seconds
    after ``stopped()`` first held, and any started later, until the block ends.

    ``stopped`` is read from the watchdog's thread: a ``threading.Event``'s or an
    ``asyncio.Event``'s ``is_set`` (a flag read, safe from any thread).
    """

    def __init__(
        self,
        connections: OpenConnections,
        stopped: Callable[[], bool],
        *,
        grace: float = STATEMENT_GRACE_SECONDS,
        tick: float = _TICK,
    ) -> None:
        self.connections = connections
        self._stopped = stopped
        self._grace = grace
        self._tick = tick
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="outboxkit-stop-watch", daemon=True
        )
        self.abandoned = 0  # statements ended so far (observability, tests)

    def __enter__(self) -> StopWatchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.connections.close()

    def _watch(self) -> None:
        since: float | None = None
        while not self._done.wait(self._tick):
            if since is None:
                if self._stopped():
                    since = time.monotonic()
                self.connections.prune()
                continue
            if time.monotonic() - since < self._grace:
                continue
            self.connections.refusing = True
            ended = self.connections.abandon_busy()
            if ended and not self.abandoned:
                logger.warning(
                    "stopping: %d statement(s) still waiting for PostgreSQL %g s after the stop;"
                    " their connections are closed (the server rolls their transactions back;"
                    " their work is done again after the next start)",
                    ended,
                    self._grace,
                )
            self.abandoned += ended
