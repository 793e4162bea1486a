"""A shard that keeps failing logs its error lines, not five lines per retry.

:class:`RetryLog` alone (an injected clock), then a shard worker whose every term fails: the
lease and term lines of the retries after the first go at DEBUG, and a term that worked
resets the back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import pytest

from outboxkit.errors import PublishError
from outboxkit.relay import shard_worker as shard_worker_module
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.retry_log import RetryLog
from outboxkit.relay.shard_worker import ShardWorker
from outboxkit.settings import load_settings
from tests.relay_support import shard_worker

pytestmark = pytest.mark.unit

GUARD = 10.0
LOGGER = "tests.relay_retry_log"


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def test_a_streak_shows_its_first_retries_then_one_line_a_minute_per_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    clock = _Clock()
    log = RetryLog(logging.getLogger(LOGGER), 3, shown_in_full=3, clock=clock)
    assert log.term_level == logging.INFO
    for n in range(10):  # the same error, a retry every 5 s
        log.retrying("PublishError", f"broker away (after {n}ms)", 5.0)
        assert log.term_level == logging.DEBUG
        clock.now += 5
    lines = _lines(caplog)
    # Three in full, then the fourth (the first through the limit); the six after it counted.
    assert len(lines) == 4, lines
    assert all(line.startswith("shard 3: PublishError: broker away") for line in lines)
    assert all(line.endswith("retrying in 5.00s") for line in lines)

    log.retrying("OperationalError", "connection refused", 5.0)  # another error: at once
    assert _lines(caplog)[-1] == "shard 3: OperationalError: connection refused; retrying in 5.00s"
    clock.now += 30  # a minute after the shown line: the next repeat shows, with the count
    log.retrying("PublishError", "broker away (after 9ms)", 5.0)
    assert _lines(caplog)[-1].endswith("retrying in 5.00s (6 similar lines suppressed over 65 s)")

    log.retrying("PublishError", "broker away (after 1ms)", 5.0)  # counted
    clock.now += 2
    log.recovered(token=7)
    *_, pending, back = _lines(caplog)
    assert pending == "shard 3: PublishError: broker away (after 1ms); retrying in 5.00s"
    assert back == "shard 3: working again with token 7 after 13 failed attempt(s) over 82.0s"
    assert log.term_level == logging.INFO
    assert log.attempts == 0
    count = len(_lines(caplog))
    log.recovered(token=7)  # nothing failed since: nothing to say
    assert len(_lines(caplog)) == count
    log.retrying("PublishError", "broker away", 5.0)  # a new streak shows its first line
    assert len(_lines(caplog)) == count + 1


class _Leases:
    """Every attempt succeeds but the ``held_at``-th (another relay holds the shard then); the
    level asked for each line is recorded."""

    def __init__(self, held_at: int | None = None) -> None:
        self.acquired: list[int] = []
        self.released: list[int] = []
        self._held_at = held_at

    async def acquire(
        self,
        group: str,
        shard: int,
        holder: str,
        ttl: float,
        wake: asyncio.Event,
        *,
        level: int = logging.INFO,
    ) -> LeaseTerm | None:
        self.acquired.append(level)
        if len(self.acquired) == self._held_at:
            return None
        return LeaseTerm(group, shard, holder, len(self.acquired), ttl, time.monotonic() + ttl)

    async def watch(self, term: LeaseTerm) -> None:
        await asyncio.Event().wait()

    async def release(self, term: LeaseTerm, *, level: int = logging.INFO) -> None:
        self.released.append(level)

    async def close(self) -> None:
        return None


async def test_lease_lines_of_retries_are_debug_and_a_term_that_worked_resets_the_back_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Terms 1-3 fail at once, term 4 works then fails, term 5 fails."""
    caplog.set_level(logging.DEBUG, logger="outboxkit.relay")
    waits: list[float] = []
    ended = asyncio.Event()

    async def recorded(events: object, seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(0)

    monkeypatch.setattr(shard_worker_module, "wait_any", recorded)
    settings = load_settings(
        overrides={
            "database": {"url": "postgresql://relay@127.0.0.1:1/outbox"},
            "relay": {"backoff_initial": 1.0, "backoff_max": 64.0},
        }
    )
    leases = _Leases()
    worker: ShardWorker = shard_worker(settings, leases=leases)  # type: ignore[arg-type]
    worker._connect = contextlib.nullcontext  # type: ignore[method-assign,assignment]

    async def term(term: LeaseTerm, conn: object) -> None:
        if term.token == 4:  # works (a Kafka commit or a retention pass), then fails
            worker._retry_log.recovered(term.token)
        if term.token == 5:
            worker.stop.set()
            ended.set()
        raise PublishError(f"producer start failed in term {term.token}")

    worker._active_term = term  # type: ignore[method-assign]
    await asyncio.wait_for(worker.run(), GUARD)
    assert ended.is_set()

    debug, info = logging.DEBUG, logging.INFO
    # Each term after a failed one takes its lease at DEBUG; term 4 worked again before its end.
    assert leases.acquired == [info, debug, debug, debug, debug]
    assert leases.released == [info, debug, debug, info, debug]
    # Back-off: full jitter in [base/2, base], the base doubling from 1 s per failure; the
    # failure of term 4, which worked, starts again from 1 s.
    bases = [1.0, 2.0, 4.0, 1.0, 2.0]
    assert len(waits) == 5, waits
    for base, seconds in zip(bases, waits, strict=True):
        assert base / 2 <= seconds <= base, waits
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    retries = [m for m in messages if "retrying in" in m]
    assert [m.split(" in term ")[1][0] for m in retries] == ["1", "2", "3", "4", "5"]
    working = "shard 0: working again with token 4 after 3 failed attempt(s)"
    assert any(m.startswith(working) for m in messages)


async def test_a_streak_ends_quietly_when_another_relay_holds_the_shard(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Term 1 fails; then another relay holds the shard; term 3 is this process's next: its
    lines are at INFO again, and nothing says this process got the shard working."""
    caplog.set_level(logging.DEBUG, logger="outboxkit.relay")

    async def at_once(events: object, seconds: float) -> None:
        await asyncio.sleep(0)

    monkeypatch.setattr(shard_worker_module, "wait_any", at_once)
    settings = load_settings(
        overrides={"database": {"url": "postgresql://relay@127.0.0.1:1/outbox"}}
    )
    leases = _Leases(held_at=2)
    worker: ShardWorker = shard_worker(settings, leases=leases)  # type: ignore[arg-type]
    worker._connect = contextlib.nullcontext  # type: ignore[method-assign,assignment]

    async def term(term: LeaseTerm, conn: object) -> None:
        if term.token == 3:
            worker._retry_log.recovered(term.token)  # as after a Kafka commit
            worker.stop.set()
            return
        raise PublishError("Kafka away")

    worker._active_term = term  # type: ignore[method-assign]
    await asyncio.wait_for(worker.run(), GUARD)
    assert leases.acquired == [logging.INFO, logging.DEBUG, logging.INFO]
    assert leases.released == [logging.INFO, logging.INFO]
    assert not any("working again" in r.getMessage() for r in caplog.records)


async def test_a_term_whose_mark_committed_before_it_failed_worked(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Term 2's mark commits, then its next statement fails before the loop comes back to the
    check at its top: the shard still worked again, and the back-off starts from 1 s."""
    caplog.set_level(logging.INFO, logger="outboxkit.relay")
    waits: list[float] = []

    async def recorded(events: object, seconds: float) -> None:
        waits.append(seconds)
        await asyncio.sleep(0)

    monkeypatch.setattr(shard_worker_module, "wait_any", recorded)
    settings = load_settings(
        overrides={
            "database": {"url": "postgresql://relay@127.0.0.1:1/outbox"},
            "relay": {"backoff_initial": 1.0, "backoff_max": 64.0},
        }
    )
    worker: ShardWorker = shard_worker(settings, leases=_Leases())  # type: ignore[arg-type]
    worker._connect = contextlib.nullcontext  # type: ignore[method-assign,assignment]

    async def term(term: LeaseTerm, conn: object) -> None:
        if term.token == 2:
            worker._publisher.stats.marks += 1  # a mark committed
        if term.token == 3:
            worker.stop.set()
        raise PublishError(f"claim failed in term {term.token}")

    worker._active_term = term  # type: ignore[method-assign]
    await asyncio.wait_for(worker.run(), GUARD)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("shard 0: working again with token 2") for m in messages), messages
    bases = [1.0, 1.0, 2.0]  # term 1 fails; term 2 worked, then failed; term 3 fails again
    assert len(waits) == 3, waits
    for base, seconds in zip(bases, waits, strict=True):
        assert base / 2 <= seconds <= base, waits


def test_a_retry_line_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """PostgreSQL's HINT and libpq's reasons come after line breaks: a full disk's warning was
    three lines, which line-based log collectors read as three records (found by a test of a
    server out of disk space)."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    log = RetryLog(logging.getLogger(LOGGER), 1, shown_in_full=3, clock=_Clock())
    text = (
        'could not extend file "base/16384/16405": No space left on device\n'
        "HINT:  Check free disk space."
    )
    log.retrying("DiskFull", text, 0.5)
    assert _lines(caplog) == [
        'shard 1: DiskFull: could not extend file "base/16384/16405": No space left on device'
        " HINT: Check free disk space.; retrying in 0.50s"
    ]
