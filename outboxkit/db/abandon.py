"""Statements a stopping process cannot wait for, ended.

A PostgreSQL that stopped answering (its processes frozen, a network partition that sends no
reset) holds a statement's wait for as long as the TCP connection lives: hours. A stop that
waits for it does not end; cancelling the wait does not help either, as psycopg then asks that
same server to cancel the statement (up to 5 s) and waits 5 s more for the answer. So our
processes watch their statements after a stop: one still in flight after
:data:`STATEMENT_GRACE_SECONDS` makes them ask the server for a new connection; if it does not
answer within :data:`PROBE_SECONDS`, they shut the sockets of the connections still waiting.
Each wait ends at once with an ``OperationalError``; the server rolls back what it has not
committed when it notices (a statement it already received may still run once it answers, as
after a kill), and the work comes again. From then on no new connection is opened: each attempt
fails at once. A server that answers is waited for, as before: its statements are slow.

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
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

logger = logging.getLogger("outboxkit.db")

#: Seconds a statement may stay in flight after a stop before the server is asked whether it
#: answers at all.
STATEMENT_GRACE_SECONDS = 5.0
#: Seconds a new connection has to answer that question (libpq's minimum connect timeout).
PROBE_SECONDS = 2
#: Our processes' bound on opening a connection (libpq's ``connect_timeout``), unless the URL or
#: ``PGCONNECT_TIMEOUT`` sets one: a server that accepts the TCP connection and then never
#: answers (frozen) would otherwise hold the start for ever.
CONNECT_TIMEOUT_SECONDS = 10


def connect_timeout(url: Any) -> dict[str, Any]:
    """``connect_timeout`` for one of our connections to ``url``: ours, unless the URL or the
    environment gives one (theirs wins)."""
    from psycopg.conninfo import conninfo_to_dict

    from outboxkit.db.connect import checked_url  # connect imports this module

    if os.environ.get("PGCONNECT_TIMEOUT"):
        return {}
    try:
        given = conninfo_to_dict(checked_url(url))
    except (psycopg.Error, ValueError):  # said where the URL is used, without its text
        given = {}
    return {} if given.get("connect_timeout") else {"connect_timeout": CONNECT_TIMEOUT_SECONDS}


_TICK = 0.25


def shut(conn: Any) -> bool:
    """Shut the socket of ``conn`` if a statement waits on it (its wait then ends at once with
    an ``OperationalError``); False if none does. Only from the thread (or event loop) that
    uses the connection: it cannot close meanwhile, so its descriptor is still its own."""
    if conn.closed or not _busy(conn):
        return False
    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as duplicate:
        _shut_down(duplicate)
    return True


def answers(url: Any, **options: Any) -> Callable[[], bool]:
    """The :class:`StopWatchdog`'s question: does the server at ``url`` answer a statement on a
    new connection within :data:`PROBE_SECONDS`? Asked from a thread of its own, which a silent
    server may hold (a daemon: the process is stopping). A refusal is no answer either: a
    server that cannot take one more connection now will not end a stuck statement."""
    from outboxkit.db.connect import connect  # connect imports this module
    from outboxkit.db.execute import execute
    from outboxkit.db.queries import query

    options = {**options, "connect_timeout": PROBE_SECONDS}
    probe = query("relay", "probe", "public")  # names no table: any schema

    def ask_in_thread(answered: threading.Event) -> None:
        with contextlib.suppress(Exception):  # any failure is no answer
            with connect(url, **options) as conn:
                execute(conn, probe)
            answered.set()

    def ask() -> bool:
        answered = threading.Event()
        threading.Thread(
            target=ask_in_thread, args=(answered,), name="outboxkit-stop-probe", daemon=True
        ).start()
        return answered.wait(PROBE_SECONDS)

    return ask


def _shut_down(duplicate: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already shut, or reset by the peer
        duplicate.shutdown(socket.SHUT_RDWR)


@dataclass
class _Tracked:
    ref: weakref.ref[Any]
    duplicate: socket.socket
    busy_since: float | None = None  # seen with a statement in flight since (every tick)


class OpenConnections:
    """The psycopg connections (sync or async) of one process, for the :class:`StopWatchdog`.

    Thread-safe: connections are tracked by whichever thread opens them and watched by a
    watchdog thread, which reads their status (a field read, under the GIL with psycopg's
    binary and C implementations).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[_Tracked] = []
        self.refusing = False  # set once the server was found not answering: no new connection

    def check_new(self) -> None:
        """Raise if no new connection may be opened (called before each connect)."""
        if self.refusing:
            raise psycopg.OperationalError(
                "no new database connection: the process is stopping and PostgreSQL does not answer"
            )

    def track(self, conn: Any) -> None:
        """Track a psycopg ``Connection`` or ``AsyncConnection`` until it closes (one that
        cannot be, out of descriptors, works untracked: a stop then waits for it)."""
        try:
            duplicate = socket.socket(fileno=os.dup(conn.pgconn.socket))
        except OSError as exc:
            logger.warning("a database connection is not tracked for the stop: %s", exc)
            return
        weakref.finalize(conn, duplicate.close)  # at the latest with the connection's object
        with self._lock:
            self._prune()
            self._held.append(_Tracked(weakref.ref(conn), duplicate))

    def __len__(self) -> int:
        with self._lock:
            self._prune()
            return len(self._held)

    def prune(self) -> None:
        """Let go of the connections closed meanwhile (their duplicates keep their sockets)."""
        with self._lock:
            self._prune()

    def observe(self, now: float) -> None:
        """Note which connections have a statement in flight, and since when."""
        with self._lock:
            self._prune()
            for held in self._held:
                conn = held.ref()
                if conn is not None and _busy(conn):
                    held.busy_since = now if held.busy_since is None else held.busy_since
                else:
                    held.busy_since = None

    def stuck(self, now: float, since: float, grace: float) -> int:
        """How many statements have been in flight for ``grace`` seconds, counted from
        ``since`` at the earliest (as of the last :meth:`observe`)."""
        with self._lock:
            return sum(
                1
                for held in self._held
                if held.busy_since is not None and now - max(held.busy_since, since) >= grace
            )

    def abandon_busy(self) -> int:
        """Shut the socket of every connection with a statement in flight; returns how many."""
        ended = 0
        with self._lock:
            self._prune()
            kept = []
            for held in self._held:
                conn = held.ref()
                if conn is not None and _busy(conn):
                    _shut_down(held.duplicate)
                    held.duplicate.close()
                    ended += 1
                else:
                    kept.append(held)
            self._held = kept
        return ended

    def close(self) -> None:
        """Stop tracking (the connections themselves stay as they are)."""
        with self._lock:
            for held in self._held:
                held.duplicate.close()
            self._held = []

    def _prune(self) -> None:
        """Drop (and close the duplicate of) every connection gone or closed."""
        kept = []
        for held in self._held:
            conn = held.ref()
            if conn is None or conn.closed:
                held.duplicate.close()
            else:
                kept.append(held)
        self._held = kept


def _busy(conn: Any) -> bool:
    return bool(conn.pgconn.transaction_status == TransactionStatus.ACTIVE)


class StopWatchdog:
    """A thread that, once ``stopped()`` holds, ends the statements of ``connections`` that
    have been in flight for ``grace`` seconds if the server does not answer ``answers()`` (a
    new connection, within its own timeout); from then on it ends every statement in flight
    and refuses new connections, until the block ends. A server that answers is waited for:
    its statements are slow, not lost (asked again every ``grace`` seconds).

    ``stopped`` is read from the watchdog's thread: a ``threading.Event``'s or an
    ``asyncio.Event``'s ``is_set`` (a flag read, safe from any thread).
    """

    def __init__(
        self,
        connections: OpenConnections,
        stopped: Callable[[], bool],
        answers: Callable[[], bool],
        *,
        grace: float = STATEMENT_GRACE_SECONDS,
        tick: float = _TICK,
    ) -> None:
        self.connections = connections
        self._stopped = stopped
        self._answers = answers
        self._grace = grace
        self._tick = tick
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name="outboxkit-stop-watch", daemon=True
        )
        self.abandoned = 0  # statements ended so far (observability, tests)
        self.waited = 0  # times the server answered while statements were stuck (tests)

    def __enter__(self) -> StopWatchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.connections.close()

    def _watch(self) -> None:
        since: float | None = None  # when the stop was first seen
        ask_after = 0.0  # when the server may be asked again
        while not self._done.wait(self._tick):
            try:
                since, ask_after = self._check(since, ask_after)
            except Exception:  # the watchdog must outlive any error, or a stop could hang
                logger.exception("stop watchdog")

    def _check(self, since: float | None, ask_after: float) -> tuple[float | None, float]:
        """One tick -> (when the stop was first seen, when the server may be asked again)."""
        now = time.monotonic()
        self.connections.observe(now)
        if since is None:
            return (time.monotonic() if self._stopped() else None), ask_after
        if self.connections.refusing:
            self.abandoned += self.connections.abandon_busy()
            return since, ask_after
        stuck = self.connections.stuck(now, since, self._grace)
        if not stuck or now < ask_after:
            return since, ask_after
        if self._answers():
            if not self.waited:
                logger.info(
                    "stopping: %d statement(s) in flight for over %g s; PostgreSQL answers,"
                    " so they are waited for",
                    stuck,
                    self._grace,
                )
            self.waited += 1
            return since, time.monotonic() + self._grace
        self.connections.refusing = True
        ended = self.connections.abandon_busy()
        self.abandoned += ended
        logger.warning(
            "stopping: %d statement(s) still waiting for PostgreSQL %g s after the stop, and it"
            " does not answer a new connection; their connections are closed (the server rolls"
            " back what it has not committed; their work is done again after the next start)",
            ended,
            self._grace,
        )
        return since, ask_after
