"""The query loader: every area loads, placeholders are filled, fragments are inserted."""

from __future__ import annotations

import pytest

from outboxkit.queries import queries

RELAY_WRITES = (
    "mark_published",
    "reconcile_published",
    "reconcile_deleted",
    "delete_published",
    "park",
    "record_failure",
    "retention_delete",
)


@pytest.mark.parametrize("area", ["outbox", "relay", "inbox"])
def test_every_placeholder_is_filled(area: str) -> None:
    loaded = queries(area, "custom_schema")
    assert loaded
    for name, text in loaded.items():
        assert "{schema}" not in text, name
        assert "{_" not in text, name
        assert not name.startswith("_"), "fragments are not queries"


def test_every_relay_write_is_fenced_by_the_lease_token() -> None:
    loaded = queries("relay", "outboxkit")
    for name in RELAY_WRITES:
        text = loaded[name]
        assert '"outboxkit".relay_lease' in text, name
        assert "token = %(token)s" in text, name
        assert "FOR SHARE" in text, name
        assert "EXISTS (SELECT 1 FROM lease)" in text, name
