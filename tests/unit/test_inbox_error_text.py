"""Error text stored or published (``last_error``, dead-letter headers, acknowledgements, logs)
carries no bound SQL parameter, also when the statement failed before it reached the server:
SQLAlchemy binding a value raises a plain Python exception (an ``Enum`` with
``validate_strings=True`` raises a ``LookupError`` quoting the value) inside a
``StatementError``."""

from __future__ import annotations

import enum

import pytest
import sqlalchemy as sa

from outboxkit.inbox.delivery import ClaimedRun
from outboxkit.inbox.envelope import identify
from outboxkit.inbox.guard import error_text
from outboxkit.inbox.steps import Sql, drive_sync
from outboxkit.inbox.store import Claim
from tests.unit.test_inbox_core import ONE, Script, _core, _env

pytestmark = pytest.mark.unit

SECRET = "s3cr3t-card-4111111111111111"


class Color(enum.Enum):
    red = 1


def _statement_error(params: dict[str, object]) -> sa.exc.StatementError:
    metadata = sa.MetaData()
    table = sa.Table(
        "t",
        metadata,
        sa.Column("c", sa.Enum(Color, validate_strings=True)),
        sa.Column("d", sa.Date),
    )
    engine = sa.create_engine("sqlite://")
    try:
        metadata.create_all(engine)
        with pytest.raises(sa.exc.StatementError) as raised, engine.begin() as conn:
            conn.execute(table.insert(), params)
    finally:
        engine.dispose()
    return raised.value


@pytest.mark.parametrize(
    ("params", "orig"),
    [
        ({"c": SECRET}, "LookupError"),  # the Enum's message quotes the value
        ({"c": None, "d": f"2020-01-01 {SECRET}"}, "TypeError"),
    ],
)
def test_an_error_raised_binding_a_parameter_is_named_by_its_types_alone(
    params: dict[str, object], orig: str
) -> None:
    exc = _statement_error(params)
    assert type(exc.orig).__name__ == orig
    assert error_text(exc) == f"StatementError ({orig}): statement failed (details hidden)"
    if orig == "LookupError":
        assert SECRET in str(exc.orig)  # what the first line of orig would have leaked
        assert SECRET in error_text(exc, detail=True)  # the opt-in still says it all


def test_a_handler_failing_to_bind_a_value_records_and_publishes_no_value() -> None:
    """The failure's text becomes ``last_error`` (and from there a dead letter's header and
    an acknowledgement's error)."""
    env = _env()
    run = ClaimedRun(env, identify(env, None), Claim.claimed(7, 1, None), lambda *a: None)
    script = Script(lambda step: ONE)
    outcome = drive_sync(_core().failed(run, _statement_error({"c": SECRET})), script)
    assert outcome.error == "StatementError (LookupError): statement failed (details hidden)"
    (recorded,) = [s for s in script.steps if isinstance(s, Sql)]
    assert recorded.query.name == "record_failure"
    assert recorded.params["error"] == outcome.error
