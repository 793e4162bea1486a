"""The GRANT script: every role's block renders, names are quoted identifiers, never text."""

from __future__ import annotations

import pytest

from outboxkit.db import grants


def test_role_names_are_quoted_identifiers() -> None:
    script = grants.render("outboxkit", {"app": 'evil"; DROP TABLE x; --'})
    assert 'TO "evil""; DROP TABLE x; --";' in script
    assert all(line.startswith("GRANT ") for line in script.splitlines())


def test_each_kind_gets_its_own_block_and_nothing_else() -> None:
    script = grants.render("billing", {"app": "a", "relay": "r", "consumer": "c"})
    app = [line for line in script.splitlines() if line.endswith('TO "a";')]
    assert not any("DELETE" in line or "UPDATE" in line or "inbox" in line for line in app)
    assert any("relay_lease" in line for line in script.splitlines() if 'TO "r"' in line)
    assert any("inbox_message" in line for line in script.splitlines() if 'TO "c"' in line)
    assert '"billing".outbox_message' in script
    assert grants.render("billing", {"relay": "r"}).count('TO "a"') == 0


def test_unknown_kinds_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown role kind"):
        grants.statements("outboxkit", {"admin": "x"})
