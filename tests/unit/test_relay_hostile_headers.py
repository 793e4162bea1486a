"""The reader turns a claimed row's headers (JSON text, see the claim) into a record; a row whose
headers cannot be read becomes that row's defect (to be parked), never a failed claim."""

from __future__ import annotations

import json
from typing import Any

import pytest

from outboxkit import db
from outboxkit.relay.reader import OutboxRecord, _record

pytestmark = pytest.mark.unit

DEEP = '{"a": ' + "[" * 2000 + "]" * 2000 + "}"


def _row(headers: str | None, row_id: int = 7) -> tuple[Any, ...]:
    """A claimed row as psycopg returns it: the columns of relay.sql's claim_batch."""
    return (
        row_id,
        "5f0c6c4e-8b0e-4c1a-9d53-1f2e3d4c5b6a",
        "idem-7",
        "orders",
        "k",
        b"{}",
        "application/json",
        headers,
        None,
        None,
        None,
        None,
        0,
    )


def test_the_claim_returns_headers_as_text_for_the_reader_to_decode() -> None:
    """psycopg decoded jsonb while fetching, where an undecodable row failed the whole claim."""
    text = " ".join(db.query("relay", "claim_batch", "outboxkit").text.split())
    assert "CAST(nullif(m.headers, '{}'::jsonb) AS text) AS headers" in text


def test_headers_nested_too_deeply_are_the_rows_defect_not_a_failed_claim() -> None:
    defects: dict[int, str] = {}
    record = _record(_row(DEEP), defects)
    assert record.headers == {}
    assert "nested too deeply" in defects[7]
    assert record.kafka_headers()  # the record itself is usable (it is parked, not sent)


@pytest.mark.parametrize(
    ("text", "headers"),
    [
        (json.dumps({"traceparent": "00-a-b-01"}), {"traceparent": "00-a-b-01"}),
        (json.dumps({"n": 1, "list": [1, 2]}), {"n": "1", "list": "[1, 2]"}),  # as their text
        (json.dumps(json.dumps({"a": "b"})), {"a": "b"}),  # double-encoded: always accepted
        ("null", {}),  # a JSON null: no headers, as psycopg's None always meant
    ],
)
def test_readable_headers_decode_as_before(text: str, headers: dict[str, str]) -> None:
    defects: dict[int, str] = {}
    record = _record(_row(text), defects)
    assert record.headers == headers
    assert defects == {}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[1, 2]", "headers must be a JSON object, not a JSON array"),
        ('"text"', "headers must be a JSON object, not a JSON string"),
        ("12", "headers must be a JSON object, not a JSON number"),
        (json.dumps(DEEP), "headers must be a JSON object, not a JSON string"),
        ("{not json", "headers are not readable JSON"),
    ],
)
def test_unreadable_headers_are_recorded_with_the_reason(text: str, reason: str) -> None:
    defects: dict[int, str] = {}
    _record(_row(text), defects)
    assert defects[7].startswith(reason)


def test_the_usual_row_skips_json_entirely() -> None:
    row = _row(None)
    record = _record(row, {})
    assert type(record) is OutboxRecord
    assert tuple(record) == row
