"""The GRANT script: every role's block renders, names are quoted identifiers, never text, and
the application may insert only the columns the writer writes."""

from __future__ import annotations

import re

import pytest

from outboxkit.db import grants
from outboxkit.db.queries import queries
from outboxkit.errors import ConfigurationError

# What the relay alone may set: a writer setting one could park or fake-publish a row.
RELAY_COLUMNS = {
    "state", "attempts", "next_attempt_at", "last_error", "parked_reason", "parked_at",
    "published_at", "kafka_partition", "kafka_offset", "xact_id", "created_at",
}  # fmt: skip


def _columns(text: str) -> list[str]:
    return [c.strip() for c in text.split(",")]


def test_role_names_are_quoted_identifiers() -> None:
    script = grants.render("outboxkit", {"app": 'evil"; DROP TABLE x; --'})
    assert 'TO "evil""; DROP TABLE x; --";' in script
    assert 'FROM "evil""; DROP TABLE x; --";' in script
    lines = script.splitlines()
    assert lines[0] == "BEGIN;"
    assert lines[-1] == "COMMIT;"
    assert all(line.startswith(("GRANT ", "REVOKE ")) for line in lines[1:-1])


def test_each_kind_gets_its_own_block_and_nothing_else() -> None:
    script = grants.render("billing", {"app": "a", "relay": "r", "consumer": "c"})
    app = [line for line in script.splitlines() if line.endswith('TO "a";')]
    assert not any("DELETE" in line or "UPDATE" in line or "inbox" in line for line in app)
    assert any("relay_lease" in line for line in script.splitlines() if 'TO "r"' in line)
    assert any("inbox_message" in line for line in script.splitlines() if 'TO "c"' in line)
    assert '"billing".outbox_message' in script
    assert grants.render("billing", {"relay": "r"}).count('TO "a"') == 0


@pytest.mark.parametrize("name", ["public", "none", "pg_read_all_data", "pg_database_owner"])
@pytest.mark.parametrize("kind", grants.ROLES)
def test_names_grant_does_not_read_as_one_role_are_refused(kind: str, name: str) -> None:
    """A quoted "public" is still PUBLIC to GRANT: every role would get the rights."""
    with pytest.raises(ConfigurationError, match=f"--{kind} {name}"):
        grants.render("outboxkit", {kind: name})


def test_names_that_only_look_special_are_roles() -> None:
    """Quoted, these name a role each (PostgreSQL 15 creates them), not PUBLIC or a keyword."""
    script = grants.render("outboxkit", {"app": "PUBLIC", "relay": "current_user"})
    assert 'TO "PUBLIC";' in script
    assert 'TO "current_user";' in script


def test_unknown_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown role kind"):
        grants.statements("outboxkit", {"admin": "x"})


def test_the_app_inserts_only_the_columns_the_writer_writes_and_converges() -> None:
    """The INSERT and COPY statements of outbox.sql name every column the writer writes; the
    app role gets INSERT of exactly those, after a REVOKE of an older whole-table INSERT."""
    written: set[str] = set()
    for query in queries("outbox", "outboxkit").values():
        found = re.match(r"(?:INSERT INTO|COPY) \S+ \(([^)]*)\)", query.text)
        if found:
            written.update(_columns(found[1]))
    app = [str(s.as_string(None)) for s in grants.statements("outboxkit", {"app": "a"})]
    revoke = app.index('REVOKE INSERT ON "outboxkit".outbox_message FROM "a"')
    inserts = [(i, line) for i, line in enumerate(app) if line.startswith("GRANT INSERT")]
    assert len(inserts) == 1
    position, line = inserts[0]
    assert revoke < position
    found = re.match(r'GRANT INSERT \(([^)]*)\) ON "outboxkit".outbox_message TO "a"$', line)
    assert found, line
    assert set(_columns(found[1])) == written
    assert "id" in written  # copy_rows sends the ids it took from the sequence
    assert not written & RELAY_COLUMNS
