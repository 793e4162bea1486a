"""A refused grant is not the record's fault (the real-stack test:
``tests/integration/test_inbox_revoked_grant.py``)."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy.exc

from outboxkit.db.availability import GRANT_HINT, grant_hint, not_the_records

pytestmark = pytest.mark.unit

CANCELLED = psycopg.errors.QueryCanceled("canceling statement due to user request")
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
