"""Event ids given to the read-back API: the writer's ``uuid.UUID`` as it is, and ids no
consumer could read from a record refused before anything is written."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine

from outboxkit import errors
from outboxkit.cli import main
from outboxkit.inbox.readback import (
    CancelResult,
    cancel_event,
    get_event,
    list_events,
    list_rejections,
)

pytestmark = pytest.mark.integration

REFUSED_IDS = ["", "a\x00b", "a\x1b[2Jb", "x" * 1025, "\ud800"]


@pytest.fixture
def engine(sa_url: str) -> Iterator[Engine]:
    eng = create_engine(sa_url)
    try:
        yield eng
    finally:
        eng.dispose()


def test_readback_takes_the_writers_uuid(engine: Engine) -> None:
    event_id = uuid.uuid4()  # what WriteResult.event_id is
    assert get_event(engine, "billing", event_id) is None
    assert cancel_event(engine, "billing", event_id) == CancelResult(False, None)
    assert cancel_event(engine, "billing", event_id, before_delivery=True).cancelled
    record = get_event(engine, "billing", event_id)
    assert record is not None
    assert (record.event_id, record.state) == (str(event_id), "cancelled")
    assert get_event(engine, "billing", str(event_id)) == record
    assert list_rejections(engine, event_id=event_id) == []


@pytest.mark.parametrize("event_id", REFUSED_IDS, ids=range(len(REFUSED_IDS)))
def test_cancel_before_delivery_refuses_an_id_no_consumer_reads(
    engine: Engine, outboxkit_db_url: str, event_id: str
) -> None:
    with pytest.raises(errors.InvalidEventIdError, match="event id refused"):
        cancel_event(engine, "billing", event_id, before_delivery=True)
    args = ["inbox", "cancel", "--consumer", "billing", "--event-id", event_id, "--before-delivery"]
    result = CliRunner().invoke(main, [*args, "--database-url", outboxkit_db_url])
    if event_id == "\ud800":  # not UTF-8: the command line refuses the argument first
        assert result.exit_code == 2, result.output
        assert "argument 6 is not valid UTF-8" in result.output
    else:
        assert result.exit_code == 1, result.output
        assert result.output.startswith("Error: event id refused"), result.output
    assert "Traceback" not in result.output
    assert list_events(engine, consumer="billing") == []  # nothing written
