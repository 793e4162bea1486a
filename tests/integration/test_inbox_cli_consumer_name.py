"""Every ``inbox`` command taking a consumer refuses a name no consumer can have (the settings
refuse it), before anything is stored: ``cancel --before-delivery`` wrote a row for it."""

from __future__ import annotations

import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine

from outboxkit.cli import main
from outboxkit.errors import ConfigurationError
from outboxkit.inbox.readback import cancel_event

pytestmark = pytest.mark.integration

LONG = "c" * 3000  # settings refuse names over 255 UTF-8 bytes
COMMANDS = [
    ["inbox", "cancel", "--event-id", "e-1", "--before-delivery", "--consumer"],
    ["inbox", "cancel", "--event-id", "e-1", "--consumer"],
    ["inbox", "show", "--consumer"],
    ["inbox", "purge", "--older-than", "60", "--consumer"],
]


@pytest.mark.parametrize("name", [LONG, ""])
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[1:3]))
def test_a_name_no_consumer_can_have_is_refused(
    outboxkit_db_url: str, args: list[str], name: str
) -> None:
    result = CliRunner().invoke(
        main, [*args, name], env={"OUTBOXKIT_DATABASE_URL": outboxkit_db_url}
    )
    assert result.exit_code == 2, result.output
    assert "no consumer can have it" in result.output
    assert LONG not in result.output
    with psycopg.connect(outboxkit_db_url) as conn:
        assert conn.execute("SELECT count(*) FROM outboxkit.inbox_message").fetchone() == (0,)


def test_cancel_event_refuses_it_too(sa_url: str) -> None:
    engine = create_engine(sa_url)
    try:
        with pytest.raises(ConfigurationError, match="consumer is 3000 bytes long"):
            cancel_event(engine, LONG, "e-1", before_delivery=True)
    finally:
        engine.dispose()
