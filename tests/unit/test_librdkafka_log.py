"""librdkafka's lines, rate-limited per client: the first of a group at once, a count after.

confluent-kafka calls ``logger.log(level, "%s [%s] %s", facility, client_name, line)``; these
tests make the same calls with a fake clock. The lines are librdkafka's own, as logged against
a broker that refuses the client (no client certificate, a refused login, nothing listening).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from outboxkit.kafka.config import CLIENT_CERTIFICATE_HINT, LIBRDKAFKA_LOGGER, confluent_config
from outboxkit.kafka.librdkafka_log import WINDOW_SECONDS, LibrdkafkaLog, normalised
from outboxkit.settings import KafkaSettings
from tests.support.clock import Clock
from tests.support.log_records import Lines

pytestmark = pytest.mark.unit

FORMAT = "%s [%s] %s"  # confluent-kafka's, see its log_cb
PRODUCER = "outboxkit#producer-1"
BROKER = "ssl://127.0.0.1:9093"


def bad_certificate(ms: int, broker: str = f"{BROKER}/bootstrap") -> str:
    return (
        f"[thrd:{broker}]: {broker}: Receive failed: error:0A000412:SSL routines::ssl/tls alert"
        f" bad certificate: SSL alert number 42 (after {ms}ms in state APIVERSION_QUERY)"
    )


def refused(ms: int, identical: int, address: str = "ipv4#127.0.0.1:9093") -> str:
    return (
        f"[thrd:{BROKER}/1]: {BROKER}/1: Connect to {address} failed: Connection refused"
        f" (after {ms}ms in state CONNECT, {identical} identical error(s) suppressed)"
    )


def refused_tail(identical: int) -> str:
    return f"Connect failed (after 0ms in state CONNECT, {identical} identical error(s) suppressed)"


@pytest.fixture
def lines() -> Iterator[Lines]:
    """What reaches LIBRDKAFKA_LOGGER's handlers, past its filters (the hints)."""
    handler = Lines()
    level = LIBRDKAFKA_LOGGER.level
    LIBRDKAFKA_LOGGER.addHandler(handler)
    LIBRDKAFKA_LOGGER.setLevel(logging.DEBUG)
    yield handler
    LIBRDKAFKA_LOGGER.removeHandler(handler)
    LIBRDKAFKA_LOGGER.setLevel(level)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def adapter(clock: Clock, **options: int) -> LibrdkafkaLog:
    return LibrdkafkaLog(LIBRDKAFKA_LOGGER, clock=clock, **options)


def test_the_first_line_shows_at_once_then_one_a_window_with_the_count(
    lines: Lines, clock: Clock
) -> None:
    log = adapter(clock)
    for n in range(1200):  # 20 a second for a minute, as against a broker refusing the client
        clock.now = 1000.0 + n / 20
        log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(n % 4))
    assert len(lines.records) == 1
    first = lines.records[0]
    assert (first.name, first.levelno) == (LIBRDKAFKA_LOGGER.name, logging.ERROR)
    assert first.getMessage().startswith(f"FAIL [{PRODUCER}] {bad_certificate(0)}")
    clock.now = 1000.0 + WINDOW_SECONDS
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(3))
    assert len(lines.records) == 2
    assert "(after 3ms in state APIVERSION_QUERY)" in lines.messages[1]
    assert "(1199 similar lines suppressed over 60 s)" in lines.messages[1]
    clock.now += 1  # a new window began with the line shown
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(1))
    assert len(lines.records) == 2
    clock.now += 14  # still within the window begun 15 s ago
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(2))
    clock.now += WINDOW_SECONDS - 15 + 1
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(3))
    assert "(2 similar lines suppressed over 61 s)" in lines.messages[2]


def test_a_later_incident_shows_at_once_after_a_quiet_window(lines: Lines, clock: Clock) -> None:
    """Counted from the last line *shown*, a second outage a little later would only be
    counted, and shown days later (or never, its client closed) as one long failure."""
    log = adapter(clock)
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(0))
    clock.now += 30  # a second outage, 20 s of lines, within the first line's window
    for n in range(400):
        clock.now += 0.05
        log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(n % 4))
    assert len(lines.records) == 1
    clock.now += 3 * 24 * 3600  # quiet for days, then a third outage
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(1))
    assert len(lines.records) == 3
    late, first = lines.messages[1:]
    assert late.startswith(
        f"FAIL [{PRODUCER}] {bad_certificate(3)} (399 similar lines suppressed over 50 s)"
    )
    assert first.startswith(f"FAIL [{PRODUCER}] {bad_certificate(1)}")
    assert "suppressed" not in first  # a first line, no count of days ago
    clock.now += 1
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(2))
    assert len(lines.records) == 3  # a new window began with it


def test_a_line_without_repeats_shows_without_a_count(lines: Lines, clock: Clock) -> None:
    log = adapter(clock)
    log.log(logging.WARNING, FORMAT, "SASL", PRODUCER, "login refused")
    clock.now += 3600
    log.log(logging.WARNING, FORMAT, "SASL", PRODUCER, "login refused")
    assert lines.messages == [f"SASL [{PRODUCER}] login refused"] * 2


def test_the_hints_still_reach_the_lines_and_the_summaries(lines: Lines, clock: Clock) -> None:
    """The hint filters sit on LIBRDKAFKA_LOGGER: the records still go through it."""
    log = adapter(clock)
    for n in range(3):
        clock.now += 0 if n == 0 else WINDOW_SECONDS / 4
        log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(0))
    clock.now += WINDOW_SECONDS / 2
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(0))
    assert len(lines.records) == 2
    assert all(CLIENT_CERTIFICATE_HINT in message for message in lines.messages)
    assert "2 similar lines suppressed" in lines.messages[1]


@pytest.mark.parametrize(
    ("first", "repeat"),
    [
        (bad_certificate(0), bad_certificate(12)),
        (refused(0, 1), refused(10001, 37)),  # librdkafka's own count, its duration
        (refused(0, 1, "ipv4#127.0.0.1:9093"), refused(0, 1, "ipv6#[::1]:9093")),
        (bad_certificate(0), bad_certificate(0, f"{BROKER}/1")),  # bootstrap, then node 1
        # A PLAINTEXT broker's name has no scheme.
        ("127.0.0.1:9092/bootstrap: Connect failed", "127.0.0.1:9092/2: Connect failed"),
        # librdkafka's own count on one line of a failure and not on the next.
        ("Connect failed (after 3ms in state CONNECT)", refused_tail(5)),
    ],
)
def test_what_varies_within_one_failure_is_one_group(
    first: str, repeat: str, lines: Lines, clock: Clock
) -> None:
    assert normalised(first) == normalised(repeat)
    log = adapter(clock)
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, first)
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, repeat)
    assert len(lines.records) == 1


@pytest.mark.parametrize(
    "other",
    [
        (logging.WARNING, "FAIL", PRODUCER, bad_certificate(0)),  # another level
        (logging.ERROR, "ERROR", PRODUCER, bad_certificate(0)),  # another facility
        (logging.ERROR, "FAIL", "outboxkit#producer-2", bad_certificate(0)),  # another client
        (logging.ERROR, "FAIL", PRODUCER, bad_certificate(0, "ssl://127.0.0.1:9094/2")),
        (logging.ERROR, "FAIL", PRODUCER, "SASL authentication error: invalid credentials"),
    ],
)
def test_other_lines_are_other_groups(
    other: tuple[int, str, str, str], lines: Lines, clock: Clock
) -> None:
    log = adapter(clock)
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(0))
    level, *args = other
    log.log(level, FORMAT, *args)
    log.log(level, FORMAT, *args)
    assert len(lines.records) == 2
    assert lines.messages[1].startswith(FORMAT % tuple(args))  # and a hint


def test_each_adapter_is_independent(lines: Lines, clock: Clock) -> None:
    """Two configurations with the same client name (two processes' worth in one test run):
    one's repeats never hide the other's first line."""
    one, two = adapter(clock), adapter(clock)
    for log in (one, two, one, two):
        log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, bad_certificate(0))
    assert len(lines.records) == 2


def test_debug_lines_pass_unlimited(lines: Lines, clock: Clock) -> None:
    """librdkafka's ``debug`` property: someone asked for every line."""
    log = adapter(clock)
    for n in range(50):
        log.log(logging.DEBUG, FORMAT, "BROKER", PRODUCER, f"state {n % 2}")
    assert len(lines.records) == 50


def test_a_fatal_error_is_logged_as_an_error_not_critical(lines: Lines, clock: Clock) -> None:
    """librdkafka's lines for a transactional producer fenced by a newer one (as logged against
    the dev stack's broker): confluent-kafka passes them as CRITICAL, and a relay shard taken
    over from a holder still running would page whoever alerts on that. Also past the limit and
    in another shape."""
    log = adapter(clock)
    fenced = (
        "[thrd:127.0.0.1:45911/1]: Fatal error: Local: This instance has been fenced by a newer"
        " instance: ProduceRequest for tx [0] with 1 message(s) failed: Broker: Producer"
        " attempted an operation with an old epoch"
    )
    log.log(logging.CRITICAL, FORMAT, "TXNERR", PRODUCER, "Fatal transaction error: " + fenced)
    log.log(logging.CRITICAL, FORMAT, "FATAL", PRODUCER, fenced)
    log.log(logging.CRITICAL, FORMAT, "FATAL", PRODUCER, fenced)  # a repeat: held back
    clock.now += WINDOW_SECONDS
    log.log(logging.CRITICAL, FORMAT, "FATAL", PRODUCER, fenced)
    log.log(logging.CRITICAL, "%s", "not librdkafka's three arguments")
    # the two lines, the repeat (shown after the window), the line after it, the other shape
    assert [r.levelno for r in lines.records] == [logging.ERROR] * 5


def test_a_call_of_another_shape_passes_through(lines: Lines, clock: Clock) -> None:
    log = adapter(clock)
    for _ in range(3):
        log.log(logging.ERROR, "%s", "not librdkafka's three arguments")
    assert lines.messages == ["not librdkafka's three arguments"] * 3


def test_lines_of_a_disabled_level_are_not_remembered(lines: Lines, clock: Clock) -> None:
    LIBRDKAFKA_LOGGER.setLevel(logging.ERROR)
    log = adapter(clock)
    log.log(logging.WARNING, FORMAT, "FAIL", PRODUCER, bad_certificate(0))
    LIBRDKAFKA_LOGGER.setLevel(logging.DEBUG)
    log.log(logging.WARNING, FORMAT, "FAIL", PRODUCER, bad_certificate(0))
    assert len(lines.records) == 1


def test_the_groups_are_bounded_and_a_dropped_group_shows_its_count(
    lines: Lines, clock: Clock
) -> None:
    log = adapter(clock, max_groups=2)
    for _ in range(4):  # group a: shown once, 3 repeats
        log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, "a")
    clock.now += 5
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, "b")
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, "b")
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, "a")  # a is the most recently seen now
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, "c")  # drops b, the least recently seen
    assert lines.messages == [
        f"FAIL [{PRODUCER}] a",
        f"FAIL [{PRODUCER}] b",
        f"FAIL [{PRODUCER}] c",
        f"FAIL [{PRODUCER}] b",  # b's one repeat: its own line, no more to count
    ]
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, "d")  # drops a: 4 repeats, one shown
    assert lines.messages[-2:] == [
        f"FAIL [{PRODUCER}] d",
        f"FAIL [{PRODUCER}] a (3 similar lines suppressed over 5 s)",
    ]
    assert len(log._limit) == 2
    log.log(logging.ERROR, FORMAT, "FAIL", PRODUCER, "b")  # forgotten: shown again
    assert lines.messages[-1] == f"FAIL [{PRODUCER}] b"


def test_a_line_that_cannot_be_grouped_is_shown_and_nothing_raises(
    lines: Lines, clock: Clock
) -> None:
    """An exception in log() would be raised by the client's next poll() instead."""

    class Unprintable:
        def __str__(self) -> str:
            raise ValueError("no text")

        def __repr__(self) -> str:
            return "<unprintable>"

    log = adapter(clock)
    log.log(logging.ERROR, "%s [%s] %r", "FAIL", PRODUCER, Unprintable())
    assert lines.messages == [f"librdkafka log line FAIL {PRODUCER} <unprintable>"]

    class Unhashable(str):
        __hash__ = None  # type: ignore[assignment]

    log.log(logging.ERROR, FORMAT, Unhashable("FAIL"), PRODUCER, "x")  # str() of each: grouped
    assert lines.messages[-1] == f"FAIL [{PRODUCER}] x"


def test_every_confluent_config_gets_a_fresh_adapter_on_the_librdkafka_logger() -> None:
    settings = KafkaSettings(bootstrap="127.0.0.1:9092")
    one, two = confluent_config(settings)["logger"], confluent_config(settings)["logger"]
    assert isinstance(one, LibrdkafkaLog)
    assert isinstance(two, LibrdkafkaLog)
    assert one is not two
    assert one.logger is LIBRDKAFKA_LOGGER
    assert one.window == WINDOW_SECONDS
