"""``migrate up``'s runs again after a deadlock (the real deadlock: the integration test
``test_migrate_deadlock``): which errors run it again, and how often."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

from outboxkit.db import migrator
from outboxkit.errors import MigrationError

pytestmark = pytest.mark.unit

URL = "postgresql://u@localhost/db"


def _failing(monkeypatch: pytest.MonkeyPatch, errors: list[BaseException]) -> list[int]:
    calls: list[int] = []

    def upgrade(target: Any, schema: str, joined: bool) -> list[int]:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return [8]

    monkeypatch.setattr(migrator, "_upgrade", upgrade)
    return calls


def _deadlock(wrapped: bool = True) -> Exception:
    cause = psycopg.errors.DeadlockDetected("deadlock detected\nDETAIL:  Process 1 waits")
    if not wrapped:
        return cause
    error = MigrationError("migration 0005_x failed: deadlock detected\nDETAIL:  Process 1 waits")
    error.__cause__ = cause
    return error


def test_a_deadlock_victim_runs_again_and_says_so_on_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = _failing(monkeypatch, [_deadlock(), _deadlock(wrapped=False)])
    with caplog.at_level(logging.WARNING, logger="outboxkit.migrate"):
        assert migrator.upgrade(URL) == [8]
    assert len(calls) == 3
    assert [r.getMessage() for r in caplog.records] == [
        "migrate up: migration 0005_x failed: deadlock detected; nothing applied,"
        " running it again (run 2 of 5)",
        "migrate up: deadlock detected; nothing applied, running it again (run 3 of 5)",
    ]


def test_the_fifth_deadlock_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _failing(monkeypatch, [_deadlock() for _ in range(migrator.DEADLOCK_RUNS)])
    with pytest.raises(MigrationError, match="deadlock detected"):
        migrator.upgrade(URL)
    assert len(calls) == migrator.DEADLOCK_RUNS


def test_any_other_failure_is_raised_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    other = MigrationError("migration 0005_x failed: permission denied")
    other.__cause__ = psycopg.errors.InsufficientPrivilege("permission denied")
    calls = _failing(monkeypatch, [other])
    with pytest.raises(MigrationError, match="permission denied"):
        migrator.upgrade(URL)
    assert len(calls) == 1
