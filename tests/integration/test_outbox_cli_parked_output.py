"""`outbox parked` prints producer-controlled text (keys, reasons) escaped, one line a row."""

from __future__ import annotations

import json

import psycopg
import pytest

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
