"""A command-line argument that is not UTF-8 is refused before anything runs, by position and
without its text. Python keeps such bytes as surrogates (``b"a\\xff"`` is ``"a\\udcff"``); they
went on to PostgreSQL, whose refusal blamed the connection's encoding settings."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from outboxkit.cli import main

pytestmark = pytest.mark.unit

NOT_UTF8 = b"s3cret\xff".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize(
    "args",
    [
        ["inbox", "cancel", "--consumer", "c", "--event-id", NOT_UTF8],
        ["relay", "status", "--database-url", f"postgresql://u:{NOT_UTF8}@127.0.0.1:1/x"],
    ],
    ids=["event id", "password"],
)
def test_an_argument_that_is_not_utf8_is_refused_by_position(args: list[str]) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"argument {len(args)} is not valid UTF-8" in result.output
    assert "s3cret" not in result.output
    assert "Traceback" not in result.output
