"""Statements a stopping process ends (``outboxkit.db.abandon``), on a real server.

A statement in flight stands in for one a frozen server never answers: ``pg_sleep``. Its wait
must end at once once abandoned, idle connections must stay usable, and no new connection may
open once the process refuses them.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from outboxkit import db
from outboxkit.db.abandon import shut
from outboxkit.db.engines import async_engine, sync_engine
from tests.support.activity import statement_running
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

# The backend notices the closed connection while it sleeps, so it does not outlive the test.
SLEEP = "SET client_connection_check_interval = '100ms'; SELECT pg_sleep(30)"
ENDED_WITHIN = 5.0  # seconds; the sleep itself lasts 30


def _sleeping(db_url: str, application_name: str) -> bool:
    return statement_running(db_url, application_name, "pg_sleep")


async def _until_sleeping(db_url: str, application_name: str, sleeping: Any) -> None:
    deadline = time.monotonic() + 30
    while not await asyncio.to_thread(_sleeping, db_url, application_name):
        assert not sleeping.done(), sleeping
        assert time.monotonic() < deadline, "the sleep never showed"


def _in_thread(work: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_a_statement_in_flight_ends_at_once_and_an_idle_connection_stays(
    outboxkit_db_url: str,
) -> None:
    connections = db.OpenConnections()
    busy = db.connect(outboxkit_db_url, application_name="abandon-busy")
    idle = db.connect(outboxkit_db_url, application_name="abandon-idle")
    connections.track(busy)
    connections.track(idle)
    try:
        thread, errors = _in_thread(lambda: busy.execute(SLEEP))
        wait_for(lambda: _sleeping(outboxkit_db_url, "abandon-busy"), what="the sleep running")
        began = time.monotonic()
        assert connections.abandon_busy() == 1
        thread.join(ENDED_WITHIN)
        assert not thread.is_alive(), "the statement still waits"
        assert time.monotonic() - began < ENDED_WITHIN
        assert [type(e) for e in errors] == [psycopg.OperationalError], errors
        assert busy.broken
        assert idle.execute("SELECT 1").fetchone() == (1,)
        assert len(connections) == 1  # the abandoned one is no longer tracked
    finally:
        busy.close()
        idle.close()
        connections.close()


async def test_an_async_statement_in_flight_ends_at_once(outboxkit_db_url: str) -> None:
    connections = db.OpenConnections()
    async with db.connection_async(
        outboxkit_db_url, application_name="abandon-async", track=connections
    ) as conn:
        sleeping = asyncio.ensure_future(conn.execute(SLEEP))
        await _until_sleeping(outboxkit_db_url, "abandon-async", sleeping)
        assert connections.abandon_busy() == 1
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(sleeping, ENDED_WITHIN)
    connections.close()


async def test_no_new_connection_once_refused(outboxkit_db_url: str) -> None:
    connections = db.OpenConnections()
    connections.refusing = True
    with pytest.raises(psycopg.OperationalError, match="the process is stopping"):
        await db.connect_async(outboxkit_db_url, track=connections)
    engine = sync_engine(outboxkit_db_url, track=connections)
    aengine = async_engine(outboxkit_db_url, track=connections)
    try:
        with pytest.raises(sa.exc.OperationalError, match="the process is stopping"):
            engine.connect()
        with pytest.raises(sa.exc.OperationalError, match="the process is stopping"):
            await aengine.connect()
    finally:
        engine.dispose()
        await aengine.dispose()


async def test_engines_track_what_their_pools_open(outboxkit_db_url: str) -> None:
    connections = db.OpenConnections()
    engine = sync_engine(outboxkit_db_url, track=connections)
    aengine = async_engine(outboxkit_db_url, track=connections)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        async with aengine.connect() as aconn:
            await aconn.execute(sa.text("SELECT 1"))
        assert len(connections) == 2  # pooled, still open
    finally:
        engine.dispose()
        await aengine.dispose()
    assert len(connections) == 0
    connections.close()


def test_the_watchdog_ends_statements_once_the_server_does_not_answer(
    outboxkit_db_url: str,
) -> None:
    connections = db.OpenConnections()
    stop = threading.Event()
    conn = db.connect(outboxkit_db_url, application_name="abandon-watched")
    connections.track(conn)
    silent = lambda: False  # noqa: E731 (a server that does not answer a new connection)
    with db.StopWatchdog(connections, stop.is_set, silent, grace=0.5, tick=0.05) as watchdog:
        thread, errors = _in_thread(lambda: conn.execute(SLEEP))
        wait_for(lambda: _sleeping(outboxkit_db_url, "abandon-watched"), what="the sleep")
        thread.join(1.0)  # no stop yet: nothing is ended
        assert thread.is_alive()
        assert watchdog.abandoned == 0
        stopped = time.monotonic()
        stop.set()
        thread.join(ENDED_WITHIN)
        assert not thread.is_alive(), "the statement still waits after the grace"
        assert time.monotonic() - stopped >= 0.45  # the grace (the stop seen within a tick)
        assert [type(e) for e in errors] == [psycopg.OperationalError]
        # counted just after the socket is shut, which may be after the statement saw it
        wait_for(lambda: watchdog.abandoned == 1, timeout=5, what="the statement counted")
        assert connections.refusing
    conn.close()


def test_the_watchdog_waits_for_a_slow_statement_of_a_server_that_answers(
    outboxkit_db_url: str,
) -> None:
    """A stop on a healthy server never ends work in flight: a statement longer than the grace
    finishes, and new connections still open."""
    connections = db.OpenConnections()
    stop = threading.Event()
    conn = db.connect(outboxkit_db_url, application_name="abandon-slow")
    connections.track(conn)
    answers = db.answers(outboxkit_db_url)
    with db.StopWatchdog(connections, stop.is_set, answers, grace=0.3, tick=0.05) as watchdog:
        stop.set()
        thread, errors = _in_thread(lambda: conn.execute("SELECT pg_sleep(4)"))
        wait_for(lambda: watchdog.waited >= 1, timeout=30, what="the server asked, answering")
        thread.join(30)
        assert not thread.is_alive()
        assert errors == []
        assert watchdog.abandoned == 0
        assert not connections.refusing
        db.connect(outboxkit_db_url, track=connections).close()
    conn.close()


def test_a_server_that_answers_and_one_that_does_not(outboxkit_db_url: str) -> None:
    assert db.answers(outboxkit_db_url)()
    with socket.socket() as listening:  # accepts TCP connections (the backlog), answers nothing
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        port = listening.getsockname()[1]
        began = time.monotonic()
        assert not db.answers(f"postgresql://nobody:x@127.0.0.1:{port}/db")()
        assert time.monotonic() - began < 5.0
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: refused at once
    assert not db.answers(f"postgresql://nobody:x@127.0.0.1:{port}/db")()


async def test_shut_ends_the_statement_waiting_on_a_connection_and_leaves_an_idle_one(
    outboxkit_db_url: str,
) -> None:
    """What the relay's lease renewal does when it gives up (no cancel request to the server)."""
    async with db.connection_async(outboxkit_db_url, application_name="abandon-shut") as conn:
        assert not shut(conn)  # idle: nothing to end
        assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
        sleeping = asyncio.ensure_future(conn.execute(SLEEP))
        await _until_sleeping(outboxkit_db_url, "abandon-shut", sleeping)
        assert shut(conn)
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(sleeping, ENDED_WITHIN)
        assert conn.broken
