"""The ``succeeded`` mark bounds how long its session may stay idle in the transaction until
the COMMIT (a consumer frozen there would hold up the next owner, see
tests/fault/test_inbox_frozen_after_mark.py): 10 s, or the session's own
``idle_in_transaction_session_timeout`` when that is shorter; only for that transaction."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from outboxkit import db
from outboxkit.inbox.store import QUIET_AFTER_MARK_SECONDS

pytestmark = pytest.mark.integration

_PROCESSING = """
INSERT INTO outboxkit.inbox_message (consumer, event_id, state, attempts, lease_token)
VALUES ('billing', %(event_id)s, 'processing', 1, 7)
"""
_SETTING = "SELECT current_setting('idle_in_transaction_session_timeout')"


@pytest.mark.parametrize(
    ("own", "in_the_transaction"),
    [("0", f"{QUIET_AFTER_MARK_SECONDS:.0f}s"), ("2s", "2s"), ("1min", "10s")],
)
def test_the_mark_sets_the_quiet_bound_keeping_a_shorter_one(
    outboxkit_db_url: str, own: str, in_the_transaction: str
) -> None:
    event_id = str(uuid.uuid4())
    mark = db.query("inbox", "mark_succeeded", "outboxkit")
    params = {"consumer": "billing", "event_id": event_id, "token": 7, "idle_ms": 10_000}
    options = f"-c idle_in_transaction_session_timeout={own}"
    with psycopg.connect(outboxkit_db_url, options=options) as conn:
        conn.execute(_PROCESSING, {"event_id": event_id})
        conn.commit()
        assert db.execute(conn, mark, params) == 1
        assert conn.execute(_SETTING).fetchone() == (in_the_transaction,)
        conn.commit()
        assert conn.execute(_SETTING).fetchone() == (own,)  # that transaction's only
