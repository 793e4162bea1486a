"""Hostile CLI input ends in one line and a non-zero exit, and quotes no part of a password.

A database URL whose user info libpq (first ``@``), urllib (last ``@``, our redaction) and
SQLAlchemy would split differently is refused before any connection, so no server is needed
here; nor for options no command can use, nor for a history file that cannot be read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from outboxkit import db, errors
from outboxkit.cli import main
from outboxkit.db.connect import HIDDEN, SHORT_SECRET
from outboxkit.errors import ConfigurationError
from outboxkit.inbox import guard
from outboxkit.settings import load_settings
from tests.support.cli_commands import SHORT_COMMANDS

UNREADABLE_HISTORY = 2  # outboxkit.cli.verify.UNREADABLE_HISTORY, as documented

MARK = "leak7"
# Each password holds LEAK7 after the character that makes the URL ambiguous.
AMBIGUOUS = {
    "two_at_signs": "postgresql://app:Pa:ss@w0rd-LEAK7@127.0.0.1:1/app",
    "at_then_port": "postgresql://app:p@ss:LEAK7w0rd99@127.0.0.1:1/app",
    "slash": "postgresql://app:LEAK7/ss@127.0.0.1:1/app",
    "digits_slash": "postgresql://app:12/LEAK7@127.0.0.1:1/app",
    "question_mark": "postgresql://app:12?LEAK7@127.0.0.1:1/app",
}
# Every command that connects (``relay run`` and ``inbox run`` never end by themselves: they are
# in tests/integration/test_no_secret_in_output.py), and ``config show``.
CONNECTING = [*SHORT_COMMANDS, ["migrate", "sql"]]
GOOD_URL = "postgresql://app:pw@127.0.0.1:1/app?connect_timeout=2"  # nothing listens on port 1


def _clean_env(**extra: str) -> dict[str, str | None]:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTBOXKIT_")}
    env.update(extra)
    return env


def _invoke(args: list[str], **env: str) -> Result:
    return CliRunner(env=_clean_env(**env)).invoke(main, args)


def _assert_one_line_error(result: Result, *codes: int) -> str:
    shown = result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code in (codes or (1, 2)), shown
    assert "Traceback" not in shown
    said = [x for x in shown.splitlines() if x.strip() and not x.startswith(("Usage:", "Try '"))]
    assert len(said) == 1, shown  # click's usage lines aside
    return shown


@pytest.mark.parametrize("case", sorted(AMBIGUOUS))
@pytest.mark.parametrize("args", CONNECTING, ids=lambda a: " ".join(a[:2]))
def test_an_ambiguous_url_is_refused_before_connecting(case: str, args: list[str]) -> None:
    result = _invoke(args, OUTBOXKIT_DATABASE_URL=AMBIGUOUS[case])
    shown = _assert_one_line_error(result)
    assert "the database URL is invalid" in shown
    assert MARK not in shown.lower()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:pw@host:5432/db?sslmode=require",
        "postgresql://app:Pa:ss@host/db",  # a ':' in the password is read alike by all three
        "postgresql://app:p%40ss%2Fw%3Frd@host/db",
        "postgres://app@host/db",
        "postgresql:///db?host=/var/run/postgresql",
        "postgresql://app:pw@/db?host=/tmp",
        "postgresql://app:pw@host/db?sslrootcert=/etc/ca%401.pem",
        "postgresql://h1:5432,h2:5433/db",
        "postgresql://app:pw@[::1]:5432/db",
        "postgresql://app@host:/db",
        "host=db user=app password=p@ss:w/rd",  # keyword/value: no user info to misread
        "",
    ],
)
def test_clear_urls_pass(url: str) -> None:
    assert db.url_problem(url) is None
    assert db.checked_url(SecretStr(url)) == url


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        *((url, None) for url in AMBIGUOUS.values()),
        ("postgresql://app:pw@host:abc/db", "a port that is not a number"),
        ("postgresql://app:pw@h1:1,h2:x/db", "a port that is not a number"),
        ("postgresql://host?password=p@ss", "a '?' before the '@'"),
        ("postgresql://app:pa#ss@host/db", "a '#' before the database name"),
        ("postgresql://app:#/@host/db", "a '#' before the database name"),
        ("postgresql://app:?x/y@host/db", "an '@' after the first '/'"),
        ("postgresql://host?sslrootcert=/etc/ca@1.pem", "an '@' after the first '/'"),
        ("postgresql://app:@?/@host/db", "an '@' after the first '/'"),
        ("postgresql://app:@/?@host/db", "an '@' after the first '/'"),
        ("postgresql://app:pw@host/db?sslrootcert=/etc/ca@1.pem", "an '@' after the first '/'"),
        ("postgresql://app:1/b?c@host/db", "an '@' after the first '/'"),
        ("postgresql://host/d@b", "an '@' after the first '/'"),
    ],
)
def test_ambiguous_urls_are_a_configuration_error_quoting_nothing(
    url: str, reason: str | None
) -> None:
    problem = db.url_problem(url)
    assert problem is not None
    if reason is not None:
        assert problem == reason
    with pytest.raises(ConfigurationError) as raised:
        db.checked_url(url)
    message = str(raised.value)  # a fixed text: nothing of the URL in it
    assert message.startswith(f"the database URL is invalid ({problem}): percent-encode '@'")
    assert message.endswith("in the user name and password")


@settings(max_examples=500)
@given(st.text(alphabet="aZ9:@/?#[],=", min_size=1, max_size=12))
def test_a_password_let_through_is_the_one_libpq_reads_and_redaction_masks(password: str) -> None:
    """What the check lets through, libpq, SQLAlchemy and the redaction read alike."""
    url = f"postgresql://app:{password}@db.invalid:5432/app"
    if db.url_problem(url) is not None:
        return
    assert conninfo_to_dict(url).get("password") == password  # what libpq may quote
    # what our redaction masks; a short one would give itself away, so the message goes
    expected = "<***>" if len(password) >= SHORT_SECRET else HIDDEN
    assert db.redact(f"<{password}>", url) == expected
    assert make_url(db.sqlalchemy_url(url)).password == password


def test_every_connection_seam_refuses_an_ambiguous_url() -> None:
    url = SecretStr(AMBIGUOUS["two_at_signs"])
    with pytest.raises(ConfigurationError):
        db.connect(url)
    with pytest.raises(ConfigurationError):
        db.sqlalchemy_url(url)
    settings = load_settings(overrides={"database": {"url": url.get_secret_value()}})
    for read in (lambda: settings.database_url, settings.redacted):
        with pytest.raises(ConfigurationError):
            read()


async def test_the_async_connection_refuses_an_ambiguous_url() -> None:
    with pytest.raises(ConfigurationError):
        await db.connect_async(AMBIGUOUS["at_then_port"])


@pytest.mark.parametrize(
    "url", ["notaurl", "host=db password=KwPw-LEAK7", "postgresql://h1:5432,h2:5433/db"]
)
def test_a_url_sqlalchemy_cannot_parse_is_one_line_for_inbox_commands(url: str) -> None:
    for args in (["inbox", "show"], ["inbox", "cancel", "--consumer", "c", "--event-id", "e"]):
        shown = _assert_one_line_error(_invoke([*args, "--database-url", url]), 1)
        assert "the database URL is invalid" in shown
        assert MARK not in shown.lower()


@pytest.mark.parametrize(
    "args",
    [
        ["inbox", "purge", "--older-than", "60", "--batch-size", "0"],
        ["inbox", "purge", "--older-than", "-1"],
        ["inbox", "purge", "--older-than", "nan"],
        ["inbox", "purge", "--older-than", "inf"],
        ["inbox", "purge", "--older-than", "60", "--all-consumers", "--schema", "Bad"],
        ["inbox", "cancel", "--consumer", "c", "--event-id", "e", "--schema", "Bad"],
        ["inbox", "show", "--schema", "Bad"],
        ["inbox", "stats", "--schema", "Bad"],
        ["relay", "status", "--schema", "Bad"],
        ["migrate", "status", "--schema", "Bad"],
    ],
    ids=lambda a: " ".join(a),
)
def test_bad_options_end_in_one_line(args: list[str]) -> None:
    _assert_one_line_error(_invoke([*args, "--database-url", GOOD_URL]))


def test_outbox_with_a_bad_schema_is_one_line() -> None:
    args = ["outbox", "--database-url", GOOD_URL, "--schema", "Bad", "parked"]
    assert "invalid schema name" in _assert_one_line_error(_invoke(args), 1)


@pytest.mark.parametrize(
    ("event_id", "problem"),
    [
        ("a\x1b[2Jb", "contains control characters"),
        ("a\x00b", "contains control characters"),
        ("x" * 1025, "1025 bytes (limit 1024)"),
        ("é" * 513, "1026 bytes (limit 1024)"),
        ("\ud800", "not valid UTF-8"),
        ("", "empty"),
    ],
    ids=["escape", "nul", "long", "long_utf8", "surrogate", "empty"],
)
def test_cancel_before_delivery_refuses_ids_no_consumer_reads(event_id: str, problem: str) -> None:
    assert guard.event_id_problem(event_id) == problem  # the API's refusal
    args = ["inbox", "cancel", "--consumer", "c", "--event-id", event_id, "--before-delivery"]
    if problem == "not valid UTF-8":  # the command line refuses such an argument first
        result = _invoke([*args, "--database-url", GOOD_URL])
        assert result.exit_code == 2
        assert "argument 6 is not valid UTF-8" in result.output
        return
    shown = _assert_one_line_error(_invoke([*args, "--database-url", GOOD_URL]), 1)
    assert f"event id refused ({problem})" in shown
    assert "\x1b" not in shown
    assert "x" * 100 not in shown


def test_cancel_event_raises_the_typed_error_before_touching_the_database() -> None:
    from sqlalchemy import create_engine

    from outboxkit.inbox.readback import cancel_event

    engine = create_engine(db.sqlalchemy_url(GOOD_URL))
    with pytest.raises(errors.InvalidEventIdError, match="control characters"):
        cancel_event(engine, "c", "bad\nid", before_delivery=True)
    assert guard.event_id_problem("0b9c5c1e-6a8e-4a43-9a55-3f6f1f6f7f5e") is None


def _history_file(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "history.json"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


@pytest.mark.parametrize(
    "text",
    [
        '{"format": 1',
        "[" * 100_000,
        '{"format": 1, "params": ' + "[" * 900 + "]" * 900 + "}",
        b"\xff\xfe",
        '{"format": "\\u001b[2J"}',
        json.dumps({"format": 1, "params": {"seed": "x"}, "\x1b[2Jkey": 1}),
    ],
    ids=["truncated", "deep", "deep_valid_json", "not_utf8", "odd_format", "bad_fields"],
)
def test_an_unreadable_history_exits_with_its_own_code(tmp_path: Path, text: str | bytes) -> None:
    result = _invoke(["verify", "--check", str(_history_file(tmp_path, text))])
    shown = _assert_one_line_error(result, UNREADABLE_HISTORY)
    assert "cannot check" in shown
    assert "\x1b" not in shown
    from outboxkit.cli import verify

    assert verify.UNREADABLE_HISTORY == UNREADABLE_HISTORY != 1  # 1 is "anomalies found"


def test_relay_run_with_a_module_of_outboxkit_missing_names_no_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A module of outboxkit itself missing (a broken or half-upgraded installation) must not
    send the user to install an unrelated extra."""
    import sys

    monkeypatch.setitem(sys.modules, "outboxkit.relay.runner", None)  # its import now fails
    result = CliRunner().invoke(
        main,
        ["relay", "run", "--database-url", "postgresql://u@127.0.0.1:1/db"],
        env={"OUTBOXKIT_KAFKA_BOOTSTRAP": "127.0.0.1:1"},
    )
    assert result.exit_code == 1, result.output
    assert "outboxkit.relay.runner" in result.output
    assert "reinstall outboxkit with its dependencies" in result.output
    assert "pip install 'outboxkit[" not in result.output
