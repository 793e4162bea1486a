"""An encrypted client key with no ``sslpassword`` in the URL: libpq let OpenSSL ask the terminal
for the pass phrase, so a CLI command or a relay (its event loop blocked) waited for someone to
type. Our connections give libpq a placeholder instead and name the missing ``sslpassword``."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from outboxkit import db

pytestmark = pytest.mark.unit

URL = "postgresql://app@127.0.0.1:1/x?sslmode=verify-full&sslkey=/keys/client.key"
KEY_ERROR = 'could not load private key file "/keys/client.key": bad decrypt'


class Refusing:
    """psycopg's connect, recording its options and failing as libpq does on such a key."""

    def __init__(self) -> None:
        self.options: dict[str, Any] = {}

    def __call__(self, conninfo: str, **options: Any) -> Any:
        self.options = options
        raise psycopg.OperationalError(f"connection failed: {KEY_ERROR}")

    async def connect_async(self, conninfo: str, **options: Any) -> Any:
        return self(conninfo, **options)


@pytest.fixture
def refusing(monkeypatch: pytest.MonkeyPatch) -> Refusing:
    fake = Refusing()
    monkeypatch.delenv("PGSERVICE", raising=False)
    monkeypatch.setattr(psycopg, "connect", fake)
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", fake.connect_async)
    return fake


def _connect(url: str, use_async: bool) -> None:
    if use_async:
        asyncio.run(db.connect_async(url))
    else:
        db.connect(url)


def _error(url: str, use_async: bool) -> str:
    with pytest.raises(psycopg.OperationalError) as caught:
        _connect(url, use_async)
    return str(caught.value)


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_no_sslpassword_means_no_prompt_and_a_named_cause(
    refusing: Refusing, use_async: bool
) -> None:
    text = _error(URL, use_async)
    assert refusing.options.get("sslpassword")  # non-empty: libpq then never prompts
    assert KEY_ERROR in text
    assert "an encrypted key needs its pass phrase as sslpassword" in text


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_given_sslpassword_is_used_as_it_is(refusing: Refusing, use_async: bool) -> None:
    text = _error(f"{URL}&sslpassword=Phrase-0123456789", use_async)
    assert "sslpassword" not in refusing.options  # the URL's own reaches libpq
    assert "Phrase-0123456789" not in text
    assert "needs its pass phrase" not in text  # a wrong pass phrase: libpq's words suffice


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_service_file_may_give_the_sslpassword(
    refusing: Refusing, use_async: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An option of ours would override the one in ``pg_service.conf``."""
    _error(f"{URL}&service=billing", use_async)
    assert "sslpassword" not in refusing.options
    monkeypatch.setenv("PGSERVICE", "billing")
    _error(URL, use_async)
    assert "sslpassword" not in refusing.options


def test_a_libpq_without_sslpassword_gets_no_such_option(
    refusing: Refusing, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq 12 and older refuse an option they do not know: every connection would fail."""
    monkeypatch.setattr(psycopg.pq, "version", lambda: 120000)
    _error(URL, use_async=False)
    assert "sslpassword" not in refusing.options
