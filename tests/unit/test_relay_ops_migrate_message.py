"""The refusal to start on a schema that is not current names the remedy that works:
`migrate up` applies pending migrations, and refuses unknown or edited ones."""

from __future__ import annotations

import pytest

from outboxkit.db import migrator
from outboxkit.errors import SchemaError

pytestmark = pytest.mark.unit


def _refusal(monkeypatch: pytest.MonkeyPatch, **found: tuple[int, ...]) -> str:
    current = migrator.MigrationStatus(
        applied=found.get("applied", (1, 2)),
        pending=found.get("pending", ()),
        unknown=found.get("unknown", ()),
        changed=found.get("changed", ()),
    )
    monkeypatch.setattr(migrator, "status", lambda target, schema: current)
    with pytest.raises(SchemaError) as caught:
        migrator.require_current("postgresql://nowhere/db", "outboxkit")
    return str(caught.value)


def test_pending_migrations_are_applied_by_migrate_up(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _refusal(monkeypatch, pending=(3,)).endswith("; run `outboxkit migrate up`")


def test_an_unknown_migration_asks_for_the_newer_release(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _refusal(monkeypatch, applied=(1, 2, 3, 4), unknown=(4,))
    assert "run `outboxkit migrate up`" not in text
    assert "ahead of this outboxkit" in text
    assert "newer outboxkit release" in text
    assert "`outboxkit migrate up` refuses such a schema" in text


def test_an_edited_migration_asks_for_the_release_that_applied_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = _refusal(monkeypatch, pending=(3,), changed=(2,))
    assert "run `outboxkit migrate up`" not in text
    assert "release that applied them" in text
    assert "`outboxkit migrate up` refuses such a schema" in text
