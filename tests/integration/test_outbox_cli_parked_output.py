"""`outbox parked` prints producer-controlled text (keys, reasons) escaped, one line a row."""

from __future__ import annotations

import json

import psycopg
import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from tests.relay_support import cli_ok, insert_rows

pytestmark = pytest.mark.integration

KEY = "a\x1b[2J\nb"
REASON = "refused:\tkey\x1b]0;pwned\x07\r\nfake 1\ttopic\tkey=x"


def test_parked_text_escapes_keys_and_reasons(outboxkit_db_url: str) -> None:
    [row_id] = insert_rows(outboxkit_db_url, "t", [(KEY, b"{}")])
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE outboxkit.outbox_message SET state = 'parked', parked_reason = %s,"
            " parked_at = now() WHERE id = %s",
            (REASON, row_id),
        )
    text = cli_ok(outboxkit_db_url, "outbox", "parked")
    assert "\x1b" not in text
    assert "\x07" not in text
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 2, lines  # the row and the count: no line faked by the key
    assert lines[0].startswith(f"{row_id}\tt\tkey=a\\x1b[2J\\nb\tshard=")
    assert lines[0].endswith("refused:\\tkey\\x1b]0;pwned\\x07\\r\\nfake 1\\ttopic\\tkey=x")
    assert lines[1] == "1 parked row(s)"
    # JSON escapes by itself: the values stay exact there.
    [item] = json.loads(cli_ok(outboxkit_db_url, "outbox", "parked", "--json"))
    assert (item["key"], item["reason"]) == (KEY, REASON)


def test_the_count_is_the_total_and_says_when_the_limit_cut_the_list(outboxkit_db_url: str) -> None:
    ids = insert_rows(outboxkit_db_url, "t", [(f"k{i}", b"{}") for i in range(5)])
    with psycopg.connect(outboxkit_db_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE outboxkit.outbox_message SET state = 'parked', parked_reason = 'r',"
            " parked_at = now() WHERE id = ANY(%s)",
            (ids,),
        )
    lines = cli_ok(outboxkit_db_url, "outbox", "parked", "--limit", "3").splitlines()
    assert [int(line.split("\t")[0]) for line in lines[:-1]] == ids[:3]
    assert lines[-1] == "5 parked row(s), the first 3 shown (--limit)"
    assert cli_ok(outboxkit_db_url, "outbox", "parked", "--limit", "0").splitlines() == [
        "5 parked row(s), the first 0 shown (--limit)"
    ]
    assert cli_ok(outboxkit_db_url, "outbox", "parked").splitlines()[-1] == "5 parked row(s)"
    # --json: the list as before; the rest is said on stderr
    result = CliRunner().invoke(
        main, ["outbox", "parked", "--json", "--limit", "2"],
        env={"OUTBOXKIT_DATABASE_URL": outboxkit_db_url},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [item["id"] for item in json.loads(result.stdout)] == ids[:2]
    assert result.stderr == "5 parked row(s), the first 2 shown (--limit)\n"
    full = CliRunner().invoke(
        main, ["outbox", "parked", "--json"], env={"OUTBOXKIT_DATABASE_URL": outboxkit_db_url}
    )
    assert len(json.loads(full.stdout)) == 5
    assert full.stderr == ""
