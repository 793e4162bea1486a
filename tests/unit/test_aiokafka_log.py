"""aiokafka's own log lines are rate-limited: a broker outage gives a few lines, not sixty a
second (the process-level case: ``tests/fault/test_inbox_recovery.py``)."""

from __future__ import annotations

import gc
import logging
import random
import uuid
import weakref
from collections.abc import Iterator

import pytest

from outboxkit.kafka.aiokafka_log import _SHARED, AiokafkaLogLimit, limit_aiokafka_log
from outboxkit.kafka.config import aiokafka_options
from outboxkit.log_limit import RepeatLimit
from outboxkit.settings import KafkaSettings
from tests.support.clock import Clock
from tests.support.log_records import Lines

pytestmark = pytest.mark.unit

REFUSED = "Unable connect to node with id %s: %s"


class Loggers:
    """Two loggers under a fresh ``aiokafka.test-…`` name, each with one limit's filter."""

    def __init__(self, clock: Clock, max_groups: int = 128) -> None:
        base = f"aiokafka.test-{uuid.uuid4().hex[:6]}"
        self.limit = AiokafkaLogLimit(RepeatLimit(clock=clock, max_groups=max_groups))
        self.lines = Lines()
        self.client = logging.getLogger(base)
        self.fetcher = logging.getLogger(f"{base}.fetcher")
        for found in (self.client, self.fetcher):
            found.addFilter(self.limit)
            found.setLevel(logging.DEBUG)
        self.client.addHandler(self.lines)  # the fetcher's lines propagate to it

    def close(self) -> None:
        self.client.removeHandler(self.lines)
        for found in (self.client, self.fetcher):
            found.removeFilter(self.limit)


def _named(loggers: Loggers) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in loggers.lines.records]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def loggers(clock: Clock) -> Iterator[Loggers]:
    made = Loggers(clock)
    yield made
    made.close()


def refused(port: int = 9092) -> ConnectionRefusedError:
    return ConnectionRefusedError(111, f"Connect call failed ('127.0.0.1', {port})")


def test_an_outage_shows_each_kind_of_line_once_a_window_with_the_count(
    loggers: Loggers, clock: Clock
) -> None:
    for n in range(600):  # every 100 ms for a minute, as aiokafka against a broker away
        clock.now = 1000.0 + n / 10
        loggers.client.error(REFUSED, 1, refused())
        loggers.fetcher.error("Failed fetch messages from %s: %s", 1, "NodeNotReadyError")
    assert _named(loggers) == [
        f"{loggers.client.name}: Unable connect to node with id 1: {refused()}",
        f"{loggers.fetcher.name}: Failed fetch messages from 1: NodeNotReadyError",
    ]
    clock.now = 1060.5  # past the window: the next line shows, with what was not shown
    loggers.client.error(REFUSED, 1, refused())
    assert _named(loggers)[-1] == (
        f"{loggers.client.name}: Unable connect to node with id 1: {refused()}"
        " (599 similar lines suppressed over 60 s)"
    )
    assert loggers.lines.records[-1].levelno == logging.ERROR


def test_another_error_is_a_line_of_its_own(loggers: Loggers, clock: Clock) -> None:
    loggers.client.error(REFUSED, 1, refused())
    loggers.client.error(REFUSED, 1, refused())
    loggers.client.error(REFUSED, 1, "[SSL: CERTIFICATE_VERIFY_FAILED]")
    loggers.client.warning(REFUSED, 1, refused())  # another level
    assert len(loggers.lines.records) == 3


def test_a_quiet_window_ends_an_incident_and_shows_its_count(
    loggers: Loggers, clock: Clock
) -> None:
    for _ in range(5):
        loggers.client.error(REFUSED, 1, refused())
        clock.now += 1
    clock.now += 120  # the broker was back for two minutes
    loggers.client.error(REFUSED, 1, refused())
    assert [r.getMessage() for r in loggers.lines.records] == [
        f"Unable connect to node with id 1: {refused()}",
        # the last line of the first outage, with the three before it that were not shown
        f"Unable connect to node with id 1: {refused()} (3 similar lines suppressed over 4 s)",
        f"Unable connect to node with id 1: {refused()}",
    ]
    stamps = [r.created for r in loggers.lines.records]
    assert stamps[1] < stamps[2]  # the count's line keeps the time of the line it was


def test_a_dropped_group_shows_its_count_once(clock: Clock) -> None:
    loggers = Loggers(clock, max_groups=1)
    try:
        for _ in range(3):
            loggers.client.error("a %s", 1)
        loggers.fetcher.error("b %s", 1)  # drops a's group
        assert [r.getMessage() for r in loggers.lines.records] == [
            "a 1",
            "a 1 (1 similar line suppressed over 1 s)",  # shown before the line that dropped it
            "b 1",
        ]
    finally:
        loggers.close()


def test_errors_without_a_message_are_told_apart_by_their_type(loggers: Loggers) -> None:
    for error in (TimeoutError(), ConnectionResetError(), TimeoutError()):
        loggers.client.error("Failed fetch messages from %s: %s", 1, error)
    assert len(loggers.lines.records) == 2


def test_debug_lines_pass_unlimited(loggers: Loggers) -> None:
    for _ in range(50):
        loggers.client.debug("Sending request %s", "MetadataRequest")
    assert len(loggers.lines.records) == 50


def test_a_line_that_cannot_be_formatted_still_shows(loggers: Loggers) -> None:
    bad = logging.LogRecord(loggers.client.name, logging.ERROR, "x.py", 1, "%d nodes", ("x",), None)
    assert all(loggers.limit.filter(bad) for _ in range(3))  # getMessage() raises: not grouped


def test_a_cluster_named_in_any_order_is_one_kind_of_line(loggers: Loggers) -> None:
    """aiokafka shuffles the broker ids before each metadata update (every 100 ms while the
    brokers are away): 720 orders of six brokers must not be 720 kinds."""
    ids = [1, 2, 3, 4, 5, 6]
    for n in range(720):
        random.Random(n).shuffle(ids)
        loggers.client.error("Unable to update metadata from %s", list(ids))
    assert len(loggers.lines.records) == 1


def test_a_line_kept_back_keeps_nothing_of_its_traceback_alive(loggers: Loggers) -> None:
    class Buffer:
        pass

    def fail(buffer: Buffer) -> None:
        raise ConnectionError("reset")

    kept: list[weakref.ref[Buffer]] = []
    for _ in range(2):  # the first shown, the second kept back until its count is shown
        buffer = Buffer()
        kept.append(weakref.ref(buffer))
        try:
            fail(buffer)
        except ConnectionError:
            loggers.client.exception("Failed fetch messages from %s", 1)
        del buffer
    gc.collect()
    # The shown line is the handlers' to keep (this test's, pytest's log capture); the one kept
    # back, whose count is still to be shown, holds no reference into its traceback.
    assert kept[1]() is None


def test_installed_on_every_aiokafka_logger_once_and_last() -> None:
    base = f"aiokafka.test-{uuid.uuid4().hex[:6]}"
    fetcher = logging.getLogger(f"{base}.fetcher")  # there when the first client is built
    aiokafka_options(KafkaSettings(bootstrap="127.0.0.1:9"))
    assert fetcher.filters[-1:] == [_SHARED]
    after = logging.Filter()  # e.g. RefusedFetchFilter, added when its module is imported
    fetcher.addFilter(after)
    late = logging.getLogger(f"{base}.late")  # a module imported after the first client
    first = logging.Filter()
    late.addFilter(first)
    try:
        aiokafka_options(KafkaSettings(bootstrap="127.0.0.1:9"))  # the next client's options
        limit_aiokafka_log()
        for found in (logging.getLogger("aiokafka"), late, fetcher):
            limits = [f for f in found.filters if isinstance(f, AiokafkaLogLimit)]
            assert len(limits) == 1
            assert found.filters[-1] is limits[0]
        assert late.filters[0] is first
    finally:
        late.removeFilter(first)
        fetcher.removeFilter(after)
