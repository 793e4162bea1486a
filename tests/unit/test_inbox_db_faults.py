"""A refused grant, and a handler's run the database interrupted, are not the record's fault
(the real-stack tests: ``tests/integration/test_inbox_revoked_grant.py`` and
``test_inbox_interrupted_run.py``)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import sqlalchemy.exc

from outboxkit.db.availability import (
    GRANT_HINT,
    database_unavailable,
    grant_hint,
    interrupted,
    not_the_records,
)
from outboxkit.inbox import OutcomeKind
from outboxkit.inbox.steps import CallHandler, CommitHandler, HandlerSql, Step, drive_sync
from tests.unit.test_inbox_core import ONE, Script, _core, _db, _env, _name

pytestmark = pytest.mark.unit

CANCELLED = psycopg.errors.QueryCanceled("canceling statement due to user request")
TERMINATED = psycopg.errors.AdminShutdown("terminating connection due to administrator command")
IDLE = psycopg.errors.IdleInTransactionSessionTimeout("idle-in-transaction timeout")
REFUSED = psycopg.errors.InsufficientPrivilege("permission denied for table inbox_message")


def _wrapped(error: psycopg.Error, invalidated: bool = False) -> sqlalchemy.exc.DBAPIError:
    return sqlalchemy.exc.OperationalError("UPDATE", {}, error, connection_invalidated=invalidated)


def test_a_refused_privilege_is_not_the_records_and_names_the_command() -> None:
    assert not_the_records(REFUSED)
    assert not_the_records(_wrapped(REFUSED))
    assert grant_hint(REFUSED) == f" ({GRANT_HINT})"
    assert "outboxkit migrate grants --consumer" in GRANT_HINT
    assert grant_hint(CANCELLED) == ""
    assert not not_the_records(psycopg.errors.InvalidTextRepresentation("a value"))


def test_the_mark_and_commit_are_interrupted_as_the_middlewares_statements() -> None:
    for error in (CANCELLED, TERMINATED, REFUSED, psycopg.errors.DeadlockDetected("x")):
        assert interrupted(_wrapped(error), own_statement=True), error
    assert not interrupted(psycopg.errors.UniqueViolation("a deferred one"), own_statement=True)


def test_a_handlers_own_errors_are_interrupted_only_by_a_lost_session() -> None:
    assert interrupted(_wrapped(TERMINATED, invalidated=True), own_statement=False)
    assert interrupted(TERMINATED, own_statement=False)
    assert interrupted(sqlalchemy.exc.TimeoutError("pool"), own_statement=False)
    # The handler's statements keep their rules: a refusal or a timeout is its run's failure.
    assert not interrupted(_wrapped(REFUSED), own_statement=False)
    assert not interrupted(_wrapped(CANCELLED), own_statement=False)
    assert not interrupted(RuntimeError("bug"), own_statement=False)


def test_a_session_its_own_wait_ended_is_the_runs_failure_wherever_it_shows() -> None:
    """Else a handler that always waits past ``idle_in_transaction_session_timeout`` would run
    for ever, never counted (``tests/integration/test_inbox_batch_connection_lost.py``)."""
    for own in (True, False):
        assert not interrupted(_wrapped(IDLE, invalidated=True), own_statement=own)


@pytest.mark.parametrize("failing", [HandlerSql, CommitHandler, CallHandler])
def test_an_interrupted_run_gives_its_claim_back_and_is_retried(failing: type[Step]) -> None:
    """With ``max_attempts=1``: not ``dead``; the claim given back, the error to the loop."""
    error = _wrapped(TERMINATED, invalidated=True)
    answer = _db((7, 1, None), handler_fails=False)

    def fails(step: Step) -> Any:
        if isinstance(step, failing):
            raise error
        return answer(step)

    script = Script(fails)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        drive_sync(_core(max_attempts=1).deliver(_env()), script)
    names = script.names()
    assert "release_batch" in names
    assert "finish" not in names
    assert "record_failure" not in names
    release = next(s for s in script.steps if _name(s) == "release_batch")
    assert release.params["event_ids"] == ["e1"]  # type: ignore[attr-defined]
    assert release.params["tokens"] == [7]  # type: ignore[attr-defined]


def test_a_handlers_refused_privilege_still_counts() -> None:
    answer = _db((7, 1, None), handler_fails=False)

    def fails(step: Step) -> Any:
        if isinstance(step, CallHandler):
            raise _wrapped(REFUSED)
        return ONE if _name(step) == "renew_lease" else answer(step)

    script = Script(fails)
    outcome = drive_sync(_core(max_attempts=1).deliver(_env()), script)
    assert outcome.kind is OutcomeKind.DEAD
    assert "release_batch" not in script.names()


def test_a_give_back_that_failed_is_made_before_the_event_is_claimed_again() -> None:
    """The server gone entirely: the give-back fails too. Made before the next claim, the
    takeover does not count the interrupted run (with ``max_attempts=1`` it would end it
    ``dead`` without running it)."""
    core = _core(max_attempts=1)
    answer = _db((7, 1, None), handler_fails=False)
    gone = _wrapped(TERMINATED, invalidated=True)

    def away(step: Step) -> Any:
        if isinstance(step, CallHandler) or _name(step) == "release_batch":
            raise gone
        return answer(step)

    with pytest.raises(sqlalchemy.exc.OperationalError):
        drive_sync(core.deliver(_env()), Script(away))
    assert core.owed.claims == {"e1": 7}
    with pytest.raises(sqlalchemy.exc.OperationalError):  # still away: still owed
        drive_sync(core.deliver(_env()), Script(away))
    assert core.owed.claims == {"e1": 7}

    script = Script(_db((8, 1, None), handler_fails=False))
    outcome = drive_sync(core.deliver(_env()), script)
    assert outcome.kind is OutcomeKind.SUCCEEDED
    assert script.names()[:2] == ["release_batch", "claim"]
    assert script.steps[0].params["tokens"] == [7]  # type: ignore[attr-defined]
    assert core.owed.claims == {}


def test_a_server_short_of_resources_is_not_the_records_on_the_middlewares_statements() -> None:
    """The lock table full ("out of shared memory", 53200), ``temp_file_limit`` (53400): the
    middleware's own statements, small whatever the record, failed five times and the record
    was given up ("rejected") while the server lacked them (found against a real server)."""
    shared = psycopg.errors.OutOfMemory("out of shared memory")
    limit = psycopg.errors.ConfigurationLimitExceeded("temporary file size exceeds temp_file_limit")
    memory = psycopg.errors.OutOfMemory("out of memory")
    for error in (shared, limit, memory, psycopg.errors.InsufficientResources("x")):
        assert not_the_records(error), error
        assert not_the_records(_wrapped(error)), error
    # In the handler's statements, as before: the handler's failure, under the retry policy.
    assert not interrupted(_wrapped(shared), own_statement=False)
    assert not database_unavailable(shared)
