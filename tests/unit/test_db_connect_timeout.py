"""Our processes' connect timeout (``outboxkit.db.connect_timeout``): ours unless the URL or
the environment gives one."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from outboxkit import db

pytestmark = pytest.mark.unit

URL = "postgresql://app:secret@db.example:5432/orders"


def test_ours_when_nothing_else_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    assert db.connect_timeout(URL) == {"connect_timeout": db.CONNECT_TIMEOUT_SECONDS}
    assert db.connect_timeout(SecretStr(URL)) == {"connect_timeout": 10}


def test_the_url_s_own_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    assert db.connect_timeout(URL + "?connect_timeout=60") == {}
    assert db.connect_timeout("host=db.example dbname=orders connect_timeout=3") == {}


def test_the_environment_s_own_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "45")
    assert db.connect_timeout(URL) == {}
