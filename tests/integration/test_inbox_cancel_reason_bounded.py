"""An operator's cancel reason is capped like every stored reason: it becomes the row's
``last_error`` and the ``cancelled`` acknowledgement's reason, and one of megabytes made that
acknowledgement too large for the broker (given up, though the docs promise it)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine

from outboxkit.inbox.guard import REASON_CHARS
from outboxkit.inbox.readback import cancel_event
from tests.integration.inbox_support import inbox_row

pytestmark = pytest.mark.integration


def test_a_huge_cancel_reason_is_stored_capped(sa_url: str, outboxkit_db_url: str) -> None:
    engine = create_engine(sa_url)
    event_id = str(uuid.uuid4())
    try:
        reason = "the order was withdrawn; " + "x" * 1_500_000
        assert cancel_event(
            engine, "billing", event_id, reason=reason, before_delivery=True
        ).cancelled
    finally:
        engine.dispose()
    row = inbox_row(outboxkit_db_url, "billing", event_id)
    assert row is not None
    assert row["state"] == "cancelled"
    assert row["last_error"].startswith("the order was withdrawn; xxx")
    assert len(row["last_error"]) <= REASON_CHARS + 100
