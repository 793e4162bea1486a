"""Invalid CLI options end in a short error, never a traceback (which could carry SQL
parameters)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from outboxkit.cli import main

pytestmark = pytest.mark.integration

HUGE = str(10**20)
CASES = [
    ["outbox", "parked", "--limit", "-1"],
    ["outbox", "parked", "--limit", HUGE],
    ["outbox", "parked", "--limit", "abc"],
    ["outbox", "retry", HUGE],
    ["outbox", "discard", "--", "-5"],
    ["relay", "status", "--group", "\x00"],
    ["relay", "shards", "5000"],
    ["relay", "pause", "--reason", "\x00"],
    ["migrate", "grants", "--app", "a\x00b", "--apply"],
    ["inbox", "show", "--limit", HUGE],
    ["inbox", "show", "--limit", "-1"],
    ["inbox", "show", "--schema", "Bad"],
    ["inbox", "stats", "--schema", "Bad"],
    ["inbox", "purge", "--older-than", "60", "--batch-size", "0"],
    ["inbox", "purge", "--older-than", "60", "--batch-size", HUGE],
    ["inbox", "purge", "--older-than", "-1"],
    ["inbox", "purge", "--older-than", "nan"],
    ["inbox", "purge", "--older-than", "60", "--all-consumers", "--schema", "Bad"],
    ["inbox", "cancel", "--consumer", "c", "--event-id", "e", "--schema", "Bad"],
    ["inbox", "cancel", "--consumer", "c", "--event-id", "a\x00b"],
    ["inbox", "cancel", "--consumer", "c", "--event-id", "a\x00b", "--before-delivery"],
    ["inbox", "cancel", "--consumer", "c", "--event-id", "a\x1b[2Jb", "--before-delivery"],
    ["inbox", "cancel", "--consumer", "c", "--event-id", "x" * 1025, "--before-delivery"],
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a)[:40])
def test_no_traceback(args: list[str], outboxkit_db_url: str) -> None:
    if args[0] == "outbox":
        full = ["outbox", "--database-url", outboxkit_db_url, *args[1:]]
    else:
        full = [*args, "--database-url", outboxkit_db_url]
    result = CliRunner().invoke(main, full)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output
    assert "parameters" not in result.output.lower()
    if args[:2] not in (["outbox", "discard"], ["outbox", "retry"]):  # no such row: 0 changed
        assert result.exit_code in (1, 2), result.output
    if "--limit" in args:  # refused by the option, before the database is asked
        assert result.exit_code == 2, result.output
        assert "Invalid value for '--limit'" in result.output
