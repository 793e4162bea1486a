"""Every spelling of a password libpq reads is masked, and a URL libpq would read otherwise than
we do (a NUL, a percent-escaped parameter name) is refused before it is used or shown."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner
from psycopg.conninfo import conninfo_to_dict
from pydantic import SecretStr

from outboxkit import db
from outboxkit.cli import main
from outboxkit.db.connect import refused
from outboxkit.errors import ConfigurationError
from outboxkit.settings import load_settings

SECRET = "S3CRET-pw"

# Spellings libpq reads as the password (or the TLS key's password).
READ_AS_PASSWORD = {
    "escaped_key": f"postgresql://u@h/db?pass%77ord={SECRET}",
    "escaped_ssl_key": f"postgresql://u@h/db?ssl%70assword={SECRET}",
    "all_escaped": f"postgresql://u@h/db?%70%61%73%73%77%6f%72%64={SECRET}",
    "escaped_after_other": f"postgresql://u@h/db?sslmode=disable&pass%77ord={SECRET}",
    "no_slash": f"postgresql://u@h?pass%77ord={SECRET}",
}


@pytest.mark.parametrize("url", READ_AS_PASSWORD.values(), ids=READ_AS_PASSWORD)
def test_a_percent_escaped_parameter_name_is_refused(url: str) -> None:
    assert SECRET in conninfo_to_dict(url).values()  # what libpq reads: a password
    assert db.url_problem(url) == "a percent-escape in a query parameter name"
    with pytest.raises(ConfigurationError) as raised:
        db.checked_url(SecretStr(url))
    assert SECRET not in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u@h/db?sslpassword={SECRET}",
        f"postgresql://u@h/db?password={SECRET}",
        "postgresql://u@h/db?password=S3%43RET-pw&sslmode=disable",  # decoded by libpq
        f"postgresql://u:{SECRET}@h/db",
        f"host=h sslpassword={SECRET}",
        f"host=h password = '{SECRET}'",
        *READ_AS_PASSWORD.values(),
    ],
)
def test_redaction_masks_every_spelling_libpq_reads(url: str) -> None:
    read = conninfo_to_dict(url)
    secret = read.get("password") or read.get("sslpassword")
    assert secret is not None
    assert secret not in db.redact(url, url)
    assert secret not in db.redact(f"server said: {secret}", url)


def test_a_nul_character_is_refused_anywhere() -> None:
    for url in (
        f"postgresql://u:{SECRET}\x00x@127.0.0.1:1/db",  # libpq would stop at the NUL
        f"postgresql://localhost:{SECRET}\x00@127.0.0.1:1/db",
        "host=h\x00 dbname=db",
    ):
        assert db.url_problem(url) == "a NUL character"
        with pytest.raises(ConfigurationError) as raised:
            db.checked_url(url)
        assert SECRET not in str(raised.value)


def _clean_env(**extra: str) -> dict[str, str | None]:
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTBOXKIT_")}
    env.update(extra)
    return env


@pytest.mark.parametrize(
    "url", [READ_AS_PASSWORD["escaped_key"], f"postgresql://u:{SECRET}\x00@127.0.0.1:1/db"]
)
def test_config_show_refuses_it_in_one_line(tmp_path: Path, url: str) -> None:
    settings = load_settings(overrides={"database": {"url": url}})
    with pytest.raises(ConfigurationError):
        settings.redacted()
    config = tmp_path / "outboxkit.toml"  # a NUL can come from a file, not from a variable
    config.write_text(f"[database]\nurl = {json.dumps(url)}\n")
    result = CliRunner(env=_clean_env(OUTBOXKIT_CONFIG=str(config))).invoke(
        main, ["config", "show"]
    )
    assert result.exit_code == 1, result.output
    assert SECRET not in result.output
    assert "the database URL is invalid" in result.output
    assert "Traceback" not in result.output


def test_a_server_refusal_is_not_called_an_invalid_url() -> None:
    url = SecretStr(f"postgresql://u:{SECRET}@h/db")
    denied = psycopg.errors.InsufficientPrivilege(f"permission denied for schema x {SECRET}")
    message = str(refused(denied, url))
    assert "the database URL is invalid" not in message
    assert message.startswith("PostgreSQL refused a start-up query: permission denied for schema")
    assert "SQLSTATE 42501" in message
    assert "migrate grants" in message
    assert SECRET not in message
    malformed = psycopg.ProgrammingError(f'invalid URI query parameter: "x"\n{SECRET}')
    message = str(refused(malformed, url))
    assert message == 'the database URL is invalid: invalid URI query parameter: "x"'


@pytest.mark.parametrize("value", ["S3CRET\\ pw7731", "'S3CRET pw7731'", "'S3CRET \\'pw7731'"])
def test_a_keyword_value_with_a_space_is_masked_whole(value: str) -> None:
    url = f"host=h port=1 password={value} dbname=d"
    assert conninfo_to_dict(url)["password"].startswith("S3CRET ")  # what libpq reads
    assert db.url_problem(url) is None
    for text in (db.redact(url, url), db.redact(f"at {url}: boom", url)):
        assert "S3CRET" not in text
        assert "pw7731" not in text
        assert "dbname=d" in text


NOT_A_URL = {
    "no_slashes": f"postgresql:/u:{SECRET}@127.0.0.1:1/db",
    "no_scheme": f"u:{SECRET}@127.0.0.1:1/db",
    "unquoted_space": "host=h password=S3CRET pw7731",
    "unclosed_quote": "host=h password='S3CRET pw7731",
    "no_keyword": f"={SECRET}",
}


@pytest.mark.parametrize("url", NOT_A_URL.values(), ids=NOT_A_URL)
def test_a_string_libpq_would_quote_whole_is_refused(url: str) -> None:
    """libpq's error (``missing "=" after "<the whole string>"``) would hold the password."""
    with pytest.raises(psycopg.ProgrammingError):
        conninfo_to_dict(url)
    assert db.url_problem(url) == "neither a scheme://... URL nor key=value pairs"
    with pytest.raises(ConfigurationError) as raised:
        db.checked_url(url)
    assert "S3CRET" not in str(raised.value)
    assert "pw7731" not in db.redact(url, url)


def test_a_url_behind_a_byte_order_mark_is_refused(tmp_path: Path) -> None:
    """A secrets file saved as "UTF-8 with BOM" holds a good URL behind U+FEFF."""
    url = f"\ufeffpostgresql://u:{SECRET}@127.0.0.1:1/db"
    assert db.url_problem(url) == "a byte-order mark (U+FEFF) at its start"
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "OUTBOXKIT_DATABASE_URL").write_text(url, encoding="utf-8")
    for args in (["config", "show"], ["migrate", "status"], ["relay", "status"]):
        result = CliRunner(env=_clean_env(OUTBOXKIT_SECRETS_DIR=str(secrets))).invoke(main, args)
        assert result.exit_code != 0, result.output
        assert SECRET not in result.output
        assert "byte-order mark" in result.output, result.output
        assert "Traceback" not in result.output


@pytest.mark.parametrize("word", ["authentication", "accepting", "Read-Write"])
def test_a_password_of_letters_alone_hides_a_message_holding_it(word: str) -> None:
    """Masked in place it would be read off the text around it: ``password *** failed``."""
    url = f"postgresql://leaky:{word}@127.0.0.1:1/d"
    text = f'FATAL:  password {word.lower()} failed for user "leaky" ({word} connections?)'
    shown = db.redact(text, url)
    assert word.casefold() not in shown.casefold()
    assert "message hidden" in shown
    assert db.redact(url, url) == "postgresql://leaky:***@127.0.0.1:1/d"


SPLIT_PASSWORD = {
    "keyword_tail": "host=127.0.0.1 port=1 password=Zq7 xW9kL=1 dbname=d",
    "query_ampersand": "postgresql://u@127.0.0.1:1/db?password=Zq7&xW9kL1",
    "query_ampersand_pair": "postgresql://u@127.0.0.1:1/db?password=Zq7&xW9=kL1",
}


@pytest.mark.parametrize("url", SPLIT_PASSWORD.values(), ids=SPLIT_PASSWORD)
def test_a_password_libpq_would_split_into_a_parameter_name_is_refused(url: str) -> None:
    """libpq's error quotes the unknown parameter (``invalid connection option "xW9kL"``): a
    piece of the password no mask can find."""
    with pytest.raises(psycopg.ProgrammingError) as libpq:
        conninfo_to_dict(url)
    assert "xW9" in str(libpq.value)
    assert db.url_problem(url) in (
        "a parameter name libpq does not know",
        "a query parameter that is not one name=value pair",
    )
    with pytest.raises(ConfigurationError) as raised:
        db.checked_url(url)
    assert "xW9" not in str(raised.value)
    assert "xW9" not in db.redact(url, url)


def test_the_newer_libpq_secrets_are_masked() -> None:
    url = "host=h oauth_client_secret=S3CRET-a1 scram_client_key=S3CRET-b2 dbname=d"
    shown = db.redact(f"at {url}", url)
    assert "S3CRET" not in shown
    assert "dbname=d" in shown
