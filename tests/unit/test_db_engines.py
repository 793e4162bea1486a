"""The sessions of ``inbox run`` carry its name, unless the user named them."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from outboxkit.db.engines import session_name

pytestmark = pytest.mark.unit

URL = "postgresql://u:secret@db.example:5432/app"


def test_our_sessions_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGAPPNAME", raising=False)
    monkeypatch.delenv("PGSERVICE", raising=False)
    assert session_name(URL, "outboxkit-inbox-billing") == {
        "application_name": "outboxkit-inbox-billing"
    }
    assert session_name(SecretStr(URL), "n") == {"application_name": "n"}


@pytest.mark.parametrize(
    "url",
    [
        URL + "?application_name=billing-prod",
        "host=db.example dbname=app application_name=billing-prod",
        URL + "?service=billing",
        "postgresql://u@db:5432/app?x=%zz",  # unreadable: the connection attempt says why
    ],
)
def test_a_name_the_user_gave_is_kept(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGAPPNAME", raising=False)
    monkeypatch.delenv("PGSERVICE", raising=False)
    assert session_name(url, "outboxkit-inbox-billing") == {}


@pytest.mark.parametrize("variable", ["PGAPPNAME", "PGSERVICE"])
def test_a_name_from_the_environment_is_kept(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, "billing-prod")
    assert session_name(URL, "outboxkit-inbox-billing") == {}
