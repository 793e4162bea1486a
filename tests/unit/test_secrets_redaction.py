"""A password never reaches an error, however it is spelled or malformed: a bad ``%`` escape
(libpq quotes the value as written), an escape that is not UTF-8 (psycopg names a byte and its
place), a password so short or so common that masking it points at it; and an unreadable secrets
directory is one typed error naming the directory."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr

from outboxkit import db
from outboxkit.cli import main
from outboxkit.db.connect import HIDDEN, refused
from outboxkit.errors import ConfigurationError
from outboxkit.settings import load_database_settings, load_settings

url_checks = importlib.import_module("outboxkit.db.url_checks")

RAW = "S3%CR%23T"  # a bad escape (%CR) beside a good one (%23): the audit's example
BAD_ESCAPES = {
    "query_password": f"postgresql://outboxkit@127.0.0.1:1/x?password={RAW}",
    "query_sslpassword": f"postgresql://outboxkit@127.0.0.1:1/x?sslpassword={RAW}",
    "user_info": f"postgresql://outboxkit:{RAW}@127.0.0.1:1/x",
}


def _clean_env(**extra: str) -> dict[str, str | None]:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTBOXKIT_")}
    env.update(extra)
    return env


def _parse_error(url: str) -> psycopg.ProgrammingError:
    with pytest.raises(psycopg.ProgrammingError) as raised:
        conninfo_to_dict(url)
    return raised.value


@pytest.mark.parametrize("url", BAD_ESCAPES.values(), ids=list(BAD_ESCAPES))
def test_libpq_quoting_a_bad_escape_as_written_is_masked(url: str) -> None:
    error = str(_parse_error(url))
    assert RAW in error  # what libpq says: the value as written
    shown = db.redact(error, url)
    for fragment in (RAW, "S3%CR", "CR%23T", "S3%CR#T"):
        assert fragment not in shown
    assert RAW not in str(refused(_parse_error(url), url))


@pytest.mark.parametrize(
    ("written", "problem"),
    [
        (RAW, "a '%' not followed by two hex digits"),
        ("S3CRET%", "a '%' not followed by two hex digits"),
        ("S3CRET%4", "a '%' not followed by two hex digits"),
        ("S3%00CRET", "a '%00' escape (a NUL character)"),
        ("S3CR%E9ET", "percent-escapes that do not decode as UTF-8"),  # Latin-1 'é'
        ("S3CR%C3ET", "percent-escapes that do not decode as UTF-8"),  # a cut sequence
    ],
)
@pytest.mark.parametrize("where", ["user_info", "query"])
def test_an_escape_libpq_or_psycopg_refuses_is_refused_quoting_nothing(
    written: str, problem: str, where: str
) -> None:
    url = (
        f"postgresql://u:{written}@127.0.0.1:1/d"
        if where == "user_info"
        else f"postgresql://u@127.0.0.1:1/d?sslmode=disable&password={written}"
    )
    assert db.url_problem(url) == problem
    for read in (db.checked_url, db.sqlalchemy_url):
        with pytest.raises(ConfigurationError) as raised:
            read(SecretStr(url))
        message = str(raised.value)
        assert message.startswith(f"the database URL is invalid ({problem}): ")
        assert "S3" not in message
        assert "\n" not in message


def test_good_escapes_still_pass() -> None:
    for url in (
        "postgresql://u:p%C3%A9%25%40@127.0.0.1:1/d",  # é, %, @
        "postgresql://u@127.0.0.1:1/d?password=%E2%82%AC&sslmode=disable",  # €
        "postgresql://u:pé@127.0.0.1:1/d",  # written as text
        "host=h password=100%",  # keyword/value: libpq decodes nothing
    ):
        assert db.url_problem(url) is None


def test_a_character_that_is_not_utf8_is_refused() -> None:
    """A variable holding a byte that is not UTF-8 (Python reads it as a surrogate)."""
    for url in ("postgresql://u:S3\udce9CRET@127.0.0.1:1/d", "host=h password=S3\udce9CRET"):
        assert db.url_problem(url) == "a character that is not UTF-8"


@pytest.mark.parametrize(
    "url", ["postgresql://u:S3CR%E9ET@127.0.0.1:1/d", "postgresql://u:S3CR\udce9ET@127.0.0.1:1/d"]
)
async def test_connecting_with_an_undecodable_password_is_a_configuration_error(url: str) -> None:
    for secret in (url, SecretStr(url)):
        with pytest.raises(ConfigurationError) as sync_error:
            db.connect(secret)
        with pytest.raises(ConfigurationError) as async_error:
            await db.connect_async(secret)
        for error in (sync_error.value, async_error.value):
            assert "S3CR" not in str(error)
            assert "0xe9" not in str(error)
            assert "position" not in str(error)


@pytest.mark.parametrize(
    "url", ["postgresql://u:p%E9@127.0.0.1:1/d", "postgresql://u:S3\udce9@h/d"]
)
async def test_a_decoding_error_the_check_missed_is_still_a_configuration_error(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connect seam itself turns psycopg's ``ValueError`` (quoting a byte of the password
    and its place) into the typed error: a second line of defence behind :func:`url_problem`."""
    monkeypatch.setattr(url_checks, "url_problem", lambda url: None)
    with pytest.raises(ConfigurationError) as sync_error:
        db.connect(url)
    with pytest.raises(ConfigurationError) as async_error:
        await db.connect_async(url)
    for error in (sync_error.value, async_error.value):
        assert str(error) == (
            "the database URL is invalid: psycopg cannot read it"
            f" ({'UnicodeDecodeError' if '%' in url else 'UnicodeEncodeError'};"
            " its text is not shown)"
        )
        assert error.__context__ is None
        assert error.__cause__ is None


@pytest.mark.parametrize("args", [["relay", "status"], ["migrate", "status"]])
def test_commands_refuse_a_bad_escape_in_one_line(args: list[str]) -> None:
    for url in BAD_ESCAPES.values():
        result = CliRunner(env=_clean_env(OUTBOXKIT_DATABASE_URL=url)).invoke(main, args)
        assert result.exit_code in (1, 2), result.output
        assert "the database URL is invalid" in result.output
        assert "Traceback" not in result.output
        for fragment in (RAW, "S3%CR", "CR%23T"):
            assert fragment not in result.output


# -- masking that would point at the password hides the message instead ----------------------

SHORT = "postgresql://outboxkit:x@127.0.0.1:1/postgres"


def test_a_short_password_inside_a_word_hides_the_message() -> None:
    text = "InsufficientPrivilege: permission denied for table inbox_rejection"
    shown = db.redact(text, SHORT)
    # the class and the fixed phrase still say what failed
    assert shown == f"InsufficientPrivilege: {HIDDEN}; it says: permission denied"
    assert "***" not in shown
    assert "inbo" not in shown


def test_a_short_password_hides_even_a_whole_word() -> None:
    for url in (SHORT, "postgresql://u@h/d?password=xyz", "host=h user=u password=pg"):
        secret = str(conninfo_to_dict(url)["password"])
        shown = db.redact(f'role "{secret}" does not exist', url)
        # the phrase is said unless the secret is in it ("x" is in "exist")
        said = "" if secret in "does not exist" else "; it says: does not exist"
        assert shown == HIDDEN + said
        assert secret not in shown


def test_a_password_equal_to_another_part_of_the_url_hides_the_message() -> None:
    url = "postgresql://outboxkit:outboxkit@127.0.0.1:1/postgres"
    shown = db.redact('password authentication failed for user "outboxkit"', url)
    assert shown == f"{HIDDEN}; it says: password authentication failed"
    url = "postgresql://app:reporting-db@127.0.0.1:1/reporting-db"
    shown = db.redact('database "reporting-db" does not exist', url)
    assert shown == f"{HIDDEN}; it says: does not exist"


def test_a_phrase_that_holds_the_password_is_not_said() -> None:
    url = "postgresql://app:refused@127.0.0.1:1/d"
    assert db.redact("connection refused (refused)", url) == HIDDEN


def test_a_phrase_found_only_inside_the_password_is_not_said() -> None:
    url = "postgresql://app:xsslq@db.example/app"
    assert db.redact('FATAL:  invalid value "xsslq" for parameter', url) == f"FATAL: {HIDDEN}"


def test_a_long_password_inside_a_longer_word_hides_the_message() -> None:
    url = "postgresql://app:rejection@127.0.0.1:1/d"
    shown = db.redact("permission denied for table inbox_rejection", url)
    assert shown == f"{HIDDEN}; it says: permission denied"
    assert "inbox_" not in shown


def test_a_long_password_quoted_on_its_own_is_still_masked() -> None:
    url = "postgresql://app:S3CRET-pw@127.0.0.1:1/d?sslmode=disable"
    assert db.redact('token: "S3CRET-pw"', url) == 'token: "***"'
    assert db.redact("said s3cret-PW.", url) == "said ***."  # an echo in another case too
    # The URL quoted in a message keeps everything but the password, whatever matches it.
    assert db.redact(f"at {url}: boom", url) == (
        "at postgresql://app:***@127.0.0.1:1/d?sslmode=disable: boom"
    )


def test_the_url_shown_keeps_every_part_but_the_password() -> None:
    """Shown alone (``config show``, "waiting for PostgreSQL at ..."), the URL is masked at its
    password's place only: a short password that matches the user name leaves it whole."""
    assert db.redact(SHORT, SHORT) == "postgresql://outboxkit:***@127.0.0.1:1/postgres"
    url = "postgresql://u@h/d?password=x&sslmode=disable&sslpassword=k"
    assert db.redact(url, url) == "postgresql://u@h/d?password=***&sslmode=disable&sslpassword=***"
    settings = load_settings(overrides={"database": {"url": SHORT}})
    assert (
        settings.redacted()["database"]["url"] == "postgresql://outboxkit:***@127.0.0.1:1/postgres"
    )


def test_a_start_up_refusal_hidden_still_gives_its_sqlstate() -> None:
    denied = psycopg.errors.InsufficientPrivilege("permission denied for table inbox_rejection")
    message = str(refused(denied, SecretStr(SHORT)))
    assert message.startswith(f"PostgreSQL refused a start-up query: {HIDDEN}")
    assert f"{HIDDEN}; it says: permission denied (SQLSTATE 42501)" in message
    assert "***" not in message
    assert "inbo" not in message


# -- an unreadable secrets directory ----------------------------------------------------------


def _secrets(tmp_path: Path) -> Path:
    directory = tmp_path / "secrets"
    directory.mkdir()
    (directory / "OUTBOXKIT_DATABASE_URL").write_text("postgresql://u:S3CRET-pw@h/d\n")
    return directory


def _denied(self: Path, *args: object, **kwargs: object) -> object:
    raise PermissionError(13, "Permission denied", str(self))


@pytest.mark.parametrize("call", ["iterdir", "stat"])
@pytest.mark.parametrize("load", [load_settings, load_database_settings])
def test_an_unreadable_secrets_directory_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str, load: Callable[[], object]
) -> None:
    """A directory owned by another user (0700) cannot be listed; one that can be listed but
    not searched (0744) cannot tell its files apart. Root can do both, so the failure is made."""
    directory = _secrets(tmp_path)
    monkeypatch.setenv("OUTBOXKIT_SECRETS_DIR", str(directory))
    real = Path.stat

    def stat(self: Path, *args: object, **kwargs: object) -> os.stat_result:
        if self.parent == directory:
            _denied(self)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, call, _denied if call == "iterdir" else stat)
    with pytest.raises(ConfigurationError) as raised:
        load()
    message = str(raised.value)
    assert str(directory) in message
    assert "Permission denied" in message
    assert "S3CRET" not in message


def test_the_cli_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = _secrets(tmp_path)
    monkeypatch.setattr(Path, "iterdir", _denied)
    result = CliRunner(env=_clean_env(OUTBOXKIT_SECRETS_DIR=str(directory))).invoke(
        main, ["config", "show"]
    )
    assert result.exit_code == 1, result.output
    assert result.output.strip() == (
        f"Error: cannot read OUTBOXKIT_SECRETS_DIR {directory}: Permission denied"
    )
