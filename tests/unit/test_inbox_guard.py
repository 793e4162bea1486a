"""Hostile input in the inbox core, without a database or Kafka: header checks before any SQL,
error text without bound parameters, bounded unexpected errors, dead-letter failures, trimming
and the retention timer (the real-stack counterpart is tests/integration/test_inbox_hostile.py).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
import sqlalchemy.exc

from outboxkit.errors import PublishError
from outboxkit.inbox import Envelope, OutcomeKind
from outboxkit.inbox.deadletter import dead_letter_headers, record_size
from outboxkit.inbox.guard import InvalidHeaderError, check_headers, error_text, escape, excerpt
from outboxkit.inbox.loop import ConsumerLoop
from outboxkit.inbox.loop_options import LoopOptions
from outboxkit.inbox.outcome import Outcome
from outboxkit.inbox.retention import Retention
from outboxkit.inbox.steps import (
    Commit,
    Plan,
    Poll,
    Publish,
    Sleep,
    Sql,
    Step,
    Subscribe,
    TopicExists,
    drive_sync,
)
from outboxkit.kafka.api import ConsumedRecord
from tests.unit.test_inbox_core import ONE, Script, _core, _db, _env, _name

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("event-id", b"a\x00b", "control characters"),
        ("event-id", b"x" * 3000, "3000 bytes"),
        ("event-type", b"t\x1b[31m", "control characters"),
        ("idempotency-key", b"\xff\xfe", "not valid UTF-8"),
    ],
)
def test_unsafe_identity_headers_are_refused_before_any_sql(
    name: str, value: bytes, problem: str
) -> None:
    headers = (("event-id", b"e1"), (name, value))
    with pytest.raises(InvalidHeaderError) as caught:
        check_headers(headers)
    assert problem in str(caught.value)
    assert "\x00" not in str(caught.value)
    assert "\x1b" not in str(caught.value)
    expected = "e1" if name != "event-id" else None
    if expected is None:
        assert (caught.value.safe_event_id or "").startswith("sha256:")
    else:
        assert caught.value.safe_event_id == expected
    check_headers((("event-id", b"e1"), ("event-type", b"order.placed")))  # fine


def test_a_nul_event_id_is_recorded_as_a_rejection_under_its_hash() -> None:
    env = Envelope.from_parts(
        topic="orders",
        partition=0,
        offset=4,
        key=b"k",
        value=b"{}",
        headers=[("event-id", b"e\x001"), ("event-type", b"x\x00")],
    )
    script = Script(_db((7, 1, None)))
    outcome = drive_sync(_core().deliver(env), script)
    assert outcome.kind is OutcomeKind.REJECTED
    assert script.names() == ["record_rejection", "EndDelivery"]
    params = script.steps[0].params  # type: ignore[attr-defined]
    assert params["event_id"].startswith("sha256:")
    assert params["event_type"] is None
    assert "\x00" not in params["reason"]
    assert "\\x00" in params["reason"]


class _Orig(Exception):
    sqlstate = "23505"


def test_database_error_text_carries_no_bound_parameters() -> None:
    orig = _Orig(
        'duplicate key value violates unique constraint "effect_pkey"\n'
        "DETAIL:  Key (email)=(a@b.c) already exists."
    )
    exc = sqlalchemy.exc.IntegrityError(
        "INSERT INTO effect VALUES (%(email)s, %(ssn)s)", {"email": "a@b.c", "ssn": "078-05"}, orig
    )
    assert "078-05" in str(exc)  # what SQLAlchemy would have stored
    text = error_text(exc)
    assert "a@b.c" not in text
    assert "078-05" not in text
    assert text.startswith("_Orig (SQLSTATE 23505): duplicate key value")
    data = type("DataErr", (Exception,), {"sqlstate": "22P02"})(
        'invalid input syntax for type integer: "078-05"'
    )
    assert "078-05" not in error_text(sqlalchemy.exc.DataError("SELECT", {}, data))
    assert "078-05" in error_text(exc, detail=True)  # the opt-in


def test_excerpts_are_bounded_and_escaped() -> None:
    assert escape("a\x1b[2Jb\n") == "a\\x1b[2Jb\\n"
    assert excerpt("z" * 1000) == "z" * 200 + "...(+800 chars)"


def _record(offset: int) -> ConsumedRecord:
    headers = (("event-id", f"e{offset}".encode()), ("event-type", b"x"))
    return ConsumedRecord("orders", 0, offset, b"k", b"{}", headers, None)


def _loop(**options: Any) -> tuple[ConsumerLoop, list[float]]:
    now = [1000.0]
    loop = ConsumerLoop(_core(), LoopOptions(topics=["orders"], **options), clock=lambda: now[0])
    return loop, now


def _polling(batches: list[list[ConsumedRecord]]) -> Script:
    """A script for a subscribed loop whose polls return ``batches`` in turn."""
    polls = iter(batches)

    def answer(step: Step) -> Any:
        if isinstance(step, Subscribe):
            step.on_assign([("orders", 0)])
        if isinstance(step, Poll):
            return next(polls)
        return ONE

    return Script(answer)


def test_a_record_failing_outside_the_handler_is_given_up_after_n_tries() -> None:
    loop, now = _loop(max_unexpected_errors=3)
    script = _polling([[_record(5)], [_record(5)], [_record(5)], [_record(6)]])

    def deliver(env: Envelope, *args: Any) -> Plan[Outcome]:
        yield from ()
        if env.offset == 5:
            raise RuntimeError("refused a value")
        return Outcome(OutcomeKind.SUCCEEDED, "e6")

    loop.core.deliver = deliver  # type: ignore[method-assign,assignment]
    kinds, alerts = [], []
    for _ in range(4):
        now[0] += 2  # past the retry hold
        outcome = drive_sync(loop.poll_once(), script)
        assert outcome is not None
        kinds.append(outcome.kind)
        alerts.append(outcome.alert)
    assert kinds == [
        OutcomeKind.RETRY,
        OutcomeKind.RETRY,
        OutcomeKind.REJECTED,
        OutcomeKind.SUCCEEDED,
    ]
    assert alerts == [None, None, "given_up", None]
    names = script.names()
    assert names.count("record_rejection") == 1
    assert names.count("abandon") == 1
    rejection = next(s for s in script.steps if _name(s) == "record_rejection")
    assert "gave up after 3 unexpected errors: RuntimeError" in rejection.params["reason"]  # type: ignore[attr-defined]
    commits = [s.offsets for s in script.steps if isinstance(s, Commit)]
    assert commits == [{("orders", 0): 6}, {("orders", 0): 7}]


def _refused() -> Exception:
    driver = psycopg.OperationalError('connection to server at "127.0.0.1", port 5 failed')
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, driver)


@pytest.mark.parametrize(
    "make",
    [_refused, psycopg.errors.AdminShutdown, psycopg.errors.CannotConnectNow],
    ids=["refused", "admin-shutdown", "starting-up"],
)
def test_a_database_outage_never_counts_against_the_record(make: Any) -> None:
    """PostgreSQL down for many attempts, then back: the record runs, it is not given up."""
    loop, now = _loop(max_unexpected_errors=2)
    attempts = 6
    script = _polling([[_record(5)] for _ in range(attempts + 1)])

    failing = [attempts]

    def deliver(env: Envelope, *args: Any) -> Plan[Outcome]:
        yield from ()
        if failing[0]:
            failing[0] -= 1
            raise make()
        return Outcome(OutcomeKind.SUCCEEDED, "e5")

    loop.core.deliver = deliver  # type: ignore[method-assign,assignment]
    kinds = []
    for _ in range(attempts + 1):
        now[0] += 2  # past the retry hold
        outcome = drive_sync(loop.poll_once(), script)
        assert outcome is not None
        kinds.append(outcome.kind)
    assert kinds == [OutcomeKind.RETRY] * attempts + [OutcomeKind.SUCCEEDED]
    assert "record_rejection" not in script.names()


def test_an_outage_is_logged_once_a_minute_not_at_every_retry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every held partition retries each second while PostgreSQL is away: the first line is
    logged, then one a minute with the count of those not logged, and its end with what was
    still uncounted; any other error every time."""
    loop, now = _loop(max_unexpected_errors=1000)
    errors: list[Exception | None] = [_refused() for _ in range(40)]
    errors += [None]  # PostgreSQL is back: the record runs
    errors += [RuntimeError("bug")] * 3
    script = _polling([[_record(5)] for _ in errors])

    def deliver(env: Envelope, *args: Any) -> Plan[Outcome]:
        yield from ()
        error = errors.pop(0)
        if error is not None:
            raise error
        return Outcome(OutcomeKind.SUCCEEDED, "e5")

    loop.core.deliver = deliver  # type: ignore[method-assign,assignment]
    with caplog.at_level(logging.INFO, logger="outboxkit.inbox.consumer"):
        for _ in range(len(errors)):
            now[0] += 2  # past the retry hold: 40 retries of the database away over 80 s
            assert drive_sync(loop.poll_once(), script) is not None
    lines = [
        (r.levelno, r.getMessage()) for r in caplog.records if r.name == "outboxkit.inbox.consumer"
    ]
    refused = "processing orders/0/5 failed: OperationalError"
    error, warning = logging.ERROR, logging.WARNING
    # The outage ends in the log at the first poll 5 s after its last line (t=1080): t=1086.
    assert [level for level, _ in lines] == [error] * 4 + [warning] + [error] * 2, lines
    assert all(text.startswith(refused) for _, text in lines[:2])
    assert lines[1][1].endswith("(29 similar lines suppressed over 60 s)")  # 30 in the window
    assert "RuntimeError: bug" in lines[2][1]  # t=1084: not the database, logged at once
    assert lines[3][1].startswith(refused)
    assert lines[3][1].endswith("(8 similar lines suppressed over 18 s)")  # 9 after the window
    assert lines[4][1] == "the database works again after 80 s; processing goes on"
    assert all("RuntimeError: bug" in text for _, text in lines[5:])
    made = [r for r in caplog.records if r.getMessage().startswith("processing")]
    # Where a line is made, not the helpers that log it (the count at the end: where it ends).
    functions = [r.funcName for r in made]
    assert functions == ["_unexpected"] * 3 + ["_housekeeping"] + ["_unexpected"] * 2


def test_a_refused_value_is_not_mistaken_for_an_outage() -> None:
    from outboxkit.db.availability import database_unavailable

    assert database_unavailable(_refused())
    assert not database_unavailable(psycopg.errors.InvalidTextRepresentation("bad"))
    assert not database_unavailable(RuntimeError("bug"))
    assert not database_unavailable(
        sqlalchemy.exc.DataError("SELECT", {}, psycopg.errors.CharacterNotInRepertoire("x"))
    )
    assert not database_unavailable(psycopg.errors.OutOfMemory("a value may bring it about"))
    assert not database_unavailable(psycopg.errors.ProgramLimitExceeded("index row too large"))
    assert not database_unavailable(psycopg.errors.IoError("could not read block 7: one row's"))
    assert not database_unavailable(psycopg.ProgrammingError("no SQLSTATE: the client refused"))


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"),
        psycopg.errors.DiskFull("could not extend file"),
        psycopg.errors.DatabaseDropped("the database was dropped"),
        psycopg.errors.IdleSessionTimeout("idle-session timeout"),
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
        psycopg.errors.DeadlockDetected("deadlock detected"),
        psycopg.errors.SerializationFailure("could not serialize access"),
        psycopg.errors.InvalidSqlStatementName('prepared statement "_pg3_0" does not exist'),
        psycopg.errors.DuplicatePreparedStatement('prepared statement "_pg3_0" already exists'),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_server_that_takes_no_writes_or_is_busy_is_the_databases_state(
    error: psycopg.Error,
) -> None:
    """Whatever the error's class (read-only is an InternalError): no record brought it about
    (a prepared statement a pooler lost: a setting did)."""
    from outboxkit.db.availability import database_unavailable

    assert database_unavailable(error)
    assert database_unavailable(sqlalchemy.exc.InternalError("INSERT", {}, error))


def test_a_refused_dead_letter_ends_the_event_dead_with_the_reason() -> None:
    base = _db((7, 3, "earlier"))

    def answer(step: Step) -> Any:
        if isinstance(step, Publish):
            raise PublishError("MSG_SIZE_TOO_LARGE: record too large")
        return base(step)

    def dead_letter(env: Envelope, event_id: str, error: str, attempts: int) -> Step:
        return Publish("orders.dlq", env.key, env.value, [])

    script = Script(answer)
    outcome = drive_sync(_core().deliver(_env(), dead_letter=dead_letter), script)
    assert outcome.kind is OutcomeKind.DEAD
    assert "dead letter could not be published to 'orders.dlq'" in (outcome.error or "")
    assert "MSG_SIZE_TOO_LARGE" in (outcome.error or "")
    assert outcome.alert == "dead_letter_failed"
    finish = next(s for s in script.steps if _name(s) == "finish")
    assert finish.params["error"] == outcome.error  # type: ignore[attr-defined]


def test_dead_letter_headers_are_trimmed_to_fit() -> None:
    value = b"v" * 900_000
    env = Envelope.from_parts(
        topic="orders",
        partition=0,
        offset=1,
        key=b"k",
        value=value,
        headers=[("event-id", b"e1"), *((f"h{n}", b"x" * 20_000) for n in range(6))],
    )
    headers = dead_letter_headers(
        env, consumer="c", event_id="e1", error="E" * 4000, attempts=3, max_bytes=1_000_000
    )
    assert record_size(b"k", value, headers) <= 1_000_000
    names = [n for n, _ in headers]
    assert names[-5:] == ["dlq-event-id", "dlq-error", "dlq-attempts", "dlq-consumer", "dlq-source"]
    assert "event-id" in names  # original headers dropped from the end, not all of them
    roomy = dead_letter_headers(
        env, consumer="c", event_id="e1", error="E" * 4000, attempts=3, max_bytes=2_000_000
    )
    assert len(roomy) == 12
    assert dict(roomy)["dlq-error"] == b"E" * 4000


def test_retention_runs_on_its_timer_in_small_batches() -> None:
    loop, now = _loop(retention=Retention(600, every_seconds=60, batch_size=2, max_batches=3))
    loop.subscribed = True
    deleted = iter([2, 2, 2, 1])

    def answer(step: Step) -> Any:
        if isinstance(step, Poll):
            return []
        if isinstance(step, Sql):
            from outboxkit.db import Result

            return Result([], next(deleted, 0))
        return ONE

    script = Script(answer)
    drive_sync(loop.poll_once(), script)
    assert script.names() == [
        "delete_finished_batch",
        "delete_finished_batch",
        "delete_finished_batch",
        "delete_rejections_batch",
        "Poll",
    ]
    drive_sync(loop.poll_once(), script)  # not due again yet
    assert script.names().count("delete_finished_batch") == 3
    now[0] += 61
    drive_sync(loop.poll_once(), script)
    assert script.names().count("delete_finished_batch") == 4
    assert loop.purger.deleted == 7


def _refusing(refusal: Exception, times: int) -> tuple[list[dict[str, Any]], Script]:
    """A script whose first ``times`` rejection records fail with ``refusal``; each record's
    parameters, in order."""
    calls: list[dict[str, Any]] = []

    def answer(step: Step) -> Any:
        if _name(step) == "record_rejection":
            calls.append(dict(step.params))  # type: ignore[attr-defined]
            if len(calls) <= times:
                raise refusal
        return ONE

    return calls, Script(answer)


def test_giving_up_falls_back_to_a_hashed_id_when_the_identity_is_refused() -> None:
    calls, script = _refusing(RuntimeError("the database refused the id"), times=1)
    outcome = drive_sync(_core().give_up(_env(), "DataError: x", 5), script)
    assert "abandon" not in script.names()  # no row is touched under a refused id
    assert outcome.kind is OutcomeKind.REJECTED
    assert [c["event_id"] for c in calls] == ["e1", outcome.event_id]
    assert (outcome.event_id or "").startswith("sha256:")
    # The second record holds only what any session stores: no event type, an ASCII reason.
    assert [c["event_type"] for c in calls] == ["order.cancelled", None]
    assert calls[1]["reason"].isascii()


def test_giving_up_records_an_ascii_reason_without_the_event_type_when_refused() -> None:
    calls, script = _refusing(RuntimeError("the database refused a value"), times=1)
    drive_sync(_core().give_up(_env(), "DataError: zu groß für 日本", 5), script)
    assert calls[0]["reason"].endswith("zu groß für 日本")
    assert calls[1]["reason"].endswith("zu gro\\xdf f\\xfcr \\u65e5\\u672c")
    assert calls[1]["event_type"] is None


def test_giving_up_while_the_database_is_away_is_retried_whole() -> None:
    """Not the values' fault: no fallback that would drop the event type and the inbox row's
    dead mark; the loop gives the record up again later."""
    away = psycopg.OperationalError("server closed the connection unexpectedly")
    calls, script = _refusing(away, times=2)
    with pytest.raises(psycopg.OperationalError):
        drive_sync(_core().give_up(_env(), "DataError: x", 5), script)
    assert len(calls) == 1


def test_a_consumer_started_while_kafka_is_away_waits_for_it() -> None:
    """The dead-letter topic check asks again (with a growing pause) instead of exiting."""
    loop, _ = _loop(dead_letter_check="fail")
    answers = iter([PublishError("metadata not readable: transport"), PublishError("again"), True])
    pauses: list[float] = []

    def answer(step: Step) -> Any:
        if isinstance(step, TopicExists):
            reply = next(answers)
            if isinstance(reply, Exception):
                raise reply
            return reply
        if isinstance(step, Sleep):
            pauses.append(step.seconds)
        return None

    assert drive_sync(loop.check_dead_letters(), Script(answer)) == []
    assert pauses == [0.5, 1.0]


@pytest.mark.parametrize("batched", [True, False], ids=["batch", "one-by-one"])
def test_a_record_whose_headers_the_client_could_not_read_is_rejected(batched: bool) -> None:
    """A header name that is not UTF-8 (the client seam passes the record with a
    ``header_error``): recorded as a rejection with that reason, and its offset passed."""
    unreadable = ConsumedRecord(
        "orders", 0, 5, b"k", b"{}", (), None, "a header name is not valid UTF-8: b'\\xff'"
    )
    loop, _ = _loop(batch_max_records=50 if batched else 1)
    script = _polling([[unreadable], [], []])
    outcomes = drive_sync(loop.poll_batch(), script)
    assert [(o.kind, o.event_id) for o in outcomes] == [(OutcomeKind.REJECTED, None)]
    assert script.names().count("claim") == 0  # no inbox row: refused before any claim
    rejection = next(s for s in script.steps if _name(s) == "record_rejection")
    params = rejection.params  # type: ignore[attr-defined]
    assert params["reason"] == "headers refused: a header name is not valid UTF-8: b'\\xff'"
    assert (params["event_id"], params["kafka_offset"]) == (None, 5)
    assert [s.offsets for s in script.steps if isinstance(s, Commit)] == [{("orders", 0): 6}]


@pytest.mark.parametrize(
    "value",
    [b"e1", b"", b"a b~", b"a\x00b", b"a\x7fb", b"x" * 1024, b"x" * 1025, b"\xc3\xa9", b"\xff"],
)
@pytest.mark.parametrize("name", ["event-id", "event-type", "idempotency-key", "other"])
def test_the_plain_header_shortcut_never_passes_what_the_check_refuses(
    name: str, value: bytes
) -> None:
    """``identify`` skips ``check_headers`` when every identity header is short printable ASCII:
    whatever that shortcut lets through, the full check passes too."""
    from outboxkit.inbox.envelope import _plain_headers

    for headers in [
        ((name, value),),
        ((name, value), (name, b"ok")),
        ((name, b"ok"), (name, value)),
    ]:
        if _plain_headers(headers):
            check_headers(headers)


def test_only_a_prepared_statement_the_pooler_lost_carries_the_pooler_hint() -> None:
    from outboxkit.db.availability import POOLER_HINT, with_pooler_hint

    lost = psycopg.errors.DuplicatePreparedStatement('prepared statement "_pg3_0" already exists')
    wrapped = sqlalchemy.exc.ProgrammingError("INSERT", {}, lost)
    assert with_pooler_hint("text", wrapped) == f"text ({POOLER_HINT})"
    assert with_pooler_hint(f"text ({POOLER_HINT})", lost) == f"text ({POOLER_HINT})"  # once
    assert with_pooler_hint("text", psycopg.errors.UniqueViolation("dup")) == "text"
    assert with_pooler_hint("text", RuntimeError("bug")) == "text"
    assert POOLER_HINT not in error_text(psycopg.errors.SerializationFailure("x"))
