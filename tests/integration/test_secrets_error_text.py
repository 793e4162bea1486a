"""Against the real PostgreSQL: error text stored and published by the consumer quotes no bound
value, whatever the value holds (a newline, a ``"``, bytes), and a connection error whose
password matches other text hides its message rather than mask that text."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import sqlalchemy as sa

from outboxkit import db
from outboxkit.db.connect import HIDDEN
from outboxkit.inbox.guard import error_text

SECRET = "S3CR3T"

# (statement, value, SQLSTATE): values that escape a quote pair, lower-cased echoes, byte dumps.
CASES = {
    "newline_in_time_zone": ("SELECT now() AT TIME ZONE :v", f"{SECRET}\nx", "22023"),
    "newline_in_setting": ("SELECT set_config('TimeZone', :v, true)", f"{SECRET}\nx", "22023"),
    "lower_cased_unit": ("SELECT date_trunc(:v, now())", f"{SECRET}\nx", "22023"),
    "quote_in_value": ("SELECT now() AT TIME ZONE :v", f'a"{SECRET}', "22023"),
    "two_quotes_in_value": ("SELECT now() AT TIME ZONE :v", f'a"{SECRET}"b', "22023"),
    "date": ("SELECT CAST(:v AS date)", SECRET, "22007"),
    "integer": ("SELECT CAST(:v AS integer)", f"{SECRET}\nx", "22P02"),
    "bytes_not_utf8": (
        "SELECT convert_from(CAST(:v AS bytea), 'UTF8')",
        "\\xe9" + SECRET.encode().hex(),
        "22021",
    ),
    "untranslatable": ("SELECT convert_to(:v, 'LATIN1')", "S\u20acCR3T", "22P05"),
    "unbalanced_outside_class_22": ("SELECT current_setting(:v)", f"{SECRET}\nx", "42704"),
    "balanced_outside_class_22": ("SELECT current_setting(:v)", f'a"{SECRET}"b', "42704"),
    "relation_from_a_value": ("SELECT CAST(:v AS regclass)", SECRET, "42P01"),
}
# How each value could show: as given, lower-cased, or as the bytes PostgreSQL dumps.
LEAKS = (SECRET.lower(), "0x53 0x33", "0xe2 0x82 0xac")


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_text_quotes_no_bound_value(engine: sa.Engine, case: str) -> None:
    statement, value, sqlstate = CASES[case]
    with engine.connect() as conn, pytest.raises(sa.exc.DBAPIError) as raised:
        conn.execute(sa.text(statement), {"v": value})
    assert getattr(raised.value.orig, "sqlstate", None) == sqlstate
    text = error_text(raised.value)
    assert f"(SQLSTATE {sqlstate})" in text
    for leak in LEAKS:
        assert leak not in text.lower(), text
    assert error_text(raised.value, detail=True) != text  # the opt-in still has it all


def test_a_data_exception_keeps_its_reason(engine: sa.Engine) -> None:
    with engine.connect() as conn, pytest.raises(sa.exc.DataError) as raised:
        conn.execute(sa.text("SELECT now() AT TIME ZONE :v"), {"v": f'a"{SECRET}'})
    assert error_text(raised.value) == (
        "InvalidParameterValue (SQLSTATE 22023): time zone (value hidden)"
    )
    with engine.connect() as conn, pytest.raises(sa.exc.DataError) as raised:
        conn.execute(sa.text("SELECT 1 / CAST(:v AS integer)"), {"v": 0})
    assert error_text(raised.value) == "DivisionByZero (SQLSTATE 22012): division by zero"


def test_an_integrity_error_keeps_the_constraint_name(engine: sa.Engine) -> None:
    """Names the schema wrote stay (the row's values are in DETAIL, which is never kept)."""
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TEMP TABLE guard_t (k text CONSTRAINT guard_k PRIMARY KEY)"))
        conn.execute(sa.text("INSERT INTO guard_t VALUES (:v)"), {"v": SECRET})
        with pytest.raises(sa.exc.IntegrityError) as raised:
            conn.execute(sa.text("INSERT INTO guard_t VALUES (:v)"), {"v": SECRET})
    assert error_text(raised.value) == (
        'UniqueViolation (SQLSTATE 23505): duplicate key value violates unique constraint "guard_k"'
    )


def _with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    netloc = f"{parts.username}:{password}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.mark.parametrize("password", ["a-letter-of-the-user", "same-as-user"])
async def test_a_wrong_password_that_matches_other_text_hides_the_message(
    outboxkit_db_url: str, password: str
) -> None:
    """PostgreSQL names the user: masking one of its letters, or a password equal to it, would
    give the password away. The fixed phrase still tells what failed."""
    user = urlsplit(outboxkit_db_url).username or ""
    phrase = "password authentication failed"
    letters = [c for c in user if c not in phrase] or list(user[:1])
    wrong = user if password == "same-as-user" else letters[0]
    url = _with_password(outboxkit_db_url, wrong)
    with pytest.raises(psycopg.OperationalError) as sync_error:
        db.connect(url, connect_timeout=10)
    with pytest.raises(psycopg.OperationalError) as async_error:
        await db.connect_async(url, connect_timeout=10)
    for error in (sync_error.value, async_error.value):
        message = str(error)
        assert message.startswith(HIDDEN), message
        if wrong not in phrase:  # a secret inside the phrase would keep it unsaid
            assert message.endswith(f"; it says: {phrase}"), message
        assert "***" not in message
        assert user not in message
        assert error.__context__ is None


def test_a_wrong_password_that_matches_nothing_keeps_the_message(outboxkit_db_url: str) -> None:
    url = _with_password(outboxkit_db_url, "N0tTheRightSecret")
    with pytest.raises(psycopg.OperationalError) as raised:
        db.connect(url, connect_timeout=10)
    assert "password authentication failed" in str(raised.value)
    assert "N0tTheRightSecret" not in str(raised.value)
