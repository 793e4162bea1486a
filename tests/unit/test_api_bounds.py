"""The Python API's own numbers (not the pydantic settings): NaN, infinity, out-of-range values
are refused when the object is built, naming the argument and its range. Each case says what
the value would have done downstream had it been accepted."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import create_engine

from outboxkit.bounds import check_range
from outboxkit.errors import ConfigurationError
from outboxkit.inbox import EventRegistry, Inbox, InboxSettings, RetryPolicy
from outboxkit.inbox.confluent import ConfluentInboxConsumer
from outboxkit.inbox.consumer import check_options, check_poll_timeout
from outboxkit.inbox.gate import PartitionGate
from outboxkit.inbox.retention import Retention, purge_finished
from outboxkit.outbox_plan import OutboxConfig
from outboxkit.settings import KafkaSettings
from outboxkit.settings.models import CENTURY, DAY, MAX_RETENTION_BATCH, KafkaClient

pytestmark = pytest.mark.unit

NAN, INF = math.nan, math.inf
REGISTRY = EventRegistry()


def test_check_range_refuses_nan_inf_and_wrong_types_without_echoing_text() -> None:
    check_range("x", 0.0, 0, 1)
    check_range("x", 10**400, 1, integer=True)  # a huge int is finite
    for value in (NAN, INF, -INF, -1, 2, True, "secret-text"):
        with pytest.raises(ValueError, match="x must be a finite number between 0 and 1") as e:
            check_range("x", value, 0, 1)
        assert "secret-text" not in str(e.value)
    with pytest.raises(ValueError, match=r"an integer above 0, not 2\.5"):
        check_range("x", 2.5, 0, above=True, integer=True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("initial_delay", NAN),  # delay() NaN: the retry is never due, the partition stays paused
        ("initial_delay", INF),
        ("initial_delay", DAY + 1),
        ("max_delay", NAN),  # min(x, nan) is x: an unbounded delay
        ("max_delay", INF),
        ("max_delay", DAY * 7),
        ("initial_delay", -1.0),
        ("multiplier", NAN),
        ("multiplier", INF),  # inf * 0 attempts: NaN
        ("multiplier", 0.5),
        ("max_attempts", NAN),  # never exhausted: a poison event retried forever
        ("max_attempts", INF),
        ("max_attempts", 0),
        ("max_attempts", 2.5),
    ],
)
def test_retry_policy_refuses_non_finite_and_out_of_range(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"RetryPolicy\.{field} must be"):
        RetryPolicy(**{field: value})  # type: ignore[arg-type]


def test_a_nan_delay_would_have_paused_the_partition_for_good() -> None:
    gate = PartitionGate()
    gate.hold(("t", 0), 5, due=100.0 + NAN)
    assert gate.due(1e18) == []  # what RetryPolicy(initial_delay=nan) led to: now refused


def test_retry_delay_does_not_overflow_after_many_attempts() -> None:
    policy = RetryPolicy(max_attempts=5000, initial_delay=1.0, multiplier=2, max_delay=DAY)
    assert policy.delay(1) == 1.0
    assert policy.delay(2000) == DAY  # 2.0 ** 1999 raises OverflowError
    assert RetryPolicy(max_attempts=5000, multiplier=10).delay(5000) == 30.0


class _NoDatabase:
    """An engine that fails the test if a purge gets as far as SQL."""

    def begin(self) -> None:
        raise AssertionError("the purge ran SQL")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"window_seconds": NAN}, "window_seconds"),  # nan <= 0 is False: passed the old check
        ({"window_seconds": INF}, "window_seconds"),  # make_interval(secs => inf) fails each time
        ({"window_seconds": CENTURY * 2}, "window_seconds"),
        ({"window_seconds": 0}, "window_seconds"),
        ({"window_seconds": 600, "every_seconds": NAN}, "every_seconds"),  # purges every poll
        ({"window_seconds": 600, "every_seconds": INF}, "every_seconds"),
        ({"window_seconds": 600, "every_seconds": DAY * 2}, "every_seconds"),
        ({"window_seconds": 600, "max_batches": 0}, "max_batches"),  # silently purges nothing
        ({"window_seconds": 600, "batch_size": MAX_RETENTION_BATCH + 1}, "batch_size"),
    ],
)
def test_retention_refuses_non_finite_and_out_of_range(
    kwargs: dict[str, float], field: str
) -> None:
    with pytest.raises(ValueError, match=rf"Retention\.{field} must be"):
        Retention(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        # Deletes the dedup rows of events finished just now: a redelivery is applied twice.
        ({"window_seconds": 0}, "window_seconds"),
        ({"window_seconds": -60}, "window_seconds"),
        ({"window_seconds": NAN}, "window_seconds"),
        ({"window_seconds": INF}, "window_seconds"),
        ({"window_seconds": 600, "max_batches": 0}, "max_batches"),
        ({"window_seconds": 600, "max_batches": -1}, "max_batches"),
        ({"window_seconds": 600, "pause_seconds": -1}, "pause_seconds"),  # time.sleep raises
        ({"window_seconds": 600, "pause_seconds": NAN}, "pause_seconds"),
        ({"window_seconds": 600, "pause_seconds": INF}, "pause_seconds"),  # sleeps forever
        ({"window_seconds": 600, "batch_size": 0}, "batch_size"),
    ],
)
def test_purge_finished_refuses_bad_numbers_before_any_sql(
    kwargs: dict[str, float], field: str
) -> None:
    with pytest.raises(ValueError, match=rf"purge_finished\.{field} must be"):
        purge_finished(_NoDatabase(), consumer="c", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lease_seconds", NAN),  # renewal interval NaN: renews in a busy loop; claims fail
        ("lease_seconds", INF),  # make_interval(secs => inf) fails every claim
        ("lease_seconds", 0.0),  # the lease expires as it is taken
        ("lease_seconds", -30.0),
        ("lease_seconds", DAY * 30),  # a crashed member's event held for a month
        ("replay_window", 0.0),  # every delivery without a dedup row refused as a replay
        ("replay_window", -1.0),
        ("replay_window", NAN),  # never too old: the window silently off
        ("replay_window", INF),
    ],
)
def test_inbox_settings_refuse_bad_lease_and_replay_window(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"InboxSettings\.{field} must be"):
        InboxSettings(consumer="c", registry=EventRegistry(), **{field: value})  # type: ignore[arg-type]


def test_inbox_settings_keep_their_defaults_and_a_replay_window() -> None:
    settings = InboxSettings(consumer="c", registry=EventRegistry(), replay_window=7 * DAY)
    assert (settings.lease_seconds, settings.replay_window) == (30.0, 7 * DAY)


VALID = {
    "offset_commit_interval": 0.0,
    "poll_timeout": 0.5,
    "max_records": 100,
    "max_unexpected_errors": 5,
    "dead_letter_max_bytes": 1_000_000,
    "batch_max_records": 50,
    "batch_max_ms": 5.0,
}


@contextmanager
def _confluent_consumer(**options: Any) -> Iterator[ConfluentInboxConsumer]:
    """A real consumer (nothing connects until it polls), closed without Kafka."""
    pytest.importorskip("confluent_kafka")
    engine = create_engine("postgresql+psycopg://u@127.0.0.1:1/db")
    inbox = Inbox(engine, lambda e, c, s: None, InboxSettings(consumer="c", registry=REGISTRY))
    kafka = KafkaSettings(bootstrap="127.0.0.1:1", client=KafkaClient.CONFLUENT)
    consumer = ConfluentInboxConsumer(
        inbox, kafka, group_id="g", topics=["t"], dead_letter=None, **options
    )
    try:
        yield consumer
    finally:
        inbox.close()
        engine.dispose()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("poll_timeout", -1.0),  # confluent-kafka waits forever: SIGTERM unheard while idle
        ("poll_timeout", NAN),  # confluent returns at once (a busy loop); aiokafka raises
        ("poll_timeout", INF),
        ("poll_timeout", 0.0),  # a busy loop while idle
        ("offset_commit_interval", INF),  # commits only on revoke and close
        ("offset_commit_interval", NAN),
        ("offset_commit_interval", -1.0),
        ("max_records", 0),  # aiokafka's getmany raises at every poll
        ("max_records", 1_000_001),  # confluent's consume() raises at every poll
        ("max_records", NAN),
        ("max_unexpected_errors", NAN),  # never given up: the partition retried forever
        ("max_unexpected_errors", INF),
        ("batch_max_records", NAN),  # takes no record at all: nothing is ever processed
        ("batch_max_records", INF),
        ("batch_max_records", 65),  # more subtransactions than PostgreSQL keeps in memory
        ("batch_max_ms", NAN),
        ("dead_letter_max_bytes", NAN),  # a TypeError when trimming: no dead letter
        ("dead_letter_max_bytes", 0),  # every original header dropped from every dead letter
        ("dead_letter_max_bytes", 10**10),  # larger than any producer takes: record refused
    ],
)
def test_consumer_options_out_of_range_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"InboxConsumer\.{field} must be"):
        check_options(**{**VALID, field: value})  # type: ignore[arg-type]
    with (
        pytest.raises(ValueError, match=rf"InboxConsumer\.{field} must be"),
        _confluent_consumer(**{field: value}),
    ):
        pass


class _NoPoll:
    def poll_once(self, timeout: float | None) -> None:
        raise AssertionError(f"polled with {timeout}")

    poll_batch = poll_once


@pytest.mark.parametrize("timeout", [-1.0, NAN, INF])
def test_a_poll_call_refuses_a_timeout_that_never_returns(timeout: float) -> None:
    with _confluent_consumer() as consumer:
        consumer.loop = _NoPoll()  # type: ignore[assignment]
        for poll in (consumer.poll_once, consumer.poll_batch):
            with pytest.raises(ValueError, match="timeout must be a finite number between 0"):
                poll(timeout)
        check_poll_timeout(0.0)
        check_poll_timeout(None)


@pytest.mark.parametrize("value", [NAN, INF, 10**12, 0, 1.5])
def test_outbox_config_refuses_a_message_limit_no_producer_has(value: float) -> None:
    # NaN/inf/huge refused nothing: the relay's producer refused the record later, parking it
    # and holding back every later message with its key.
    with pytest.raises(ConfigurationError, match=r"OutboxConfig\.max_message_bytes must be"):
        OutboxConfig(max_message_bytes=value)  # type: ignore[arg-type]


def test_only_numbers_every_driver_takes_pass_and_a_float_is_no_integer() -> None:
    """A Fraction compares like a number but psycopg cannot send it (the purge would fail at
    every interval); a Decimal it can. 5.0 where an integer is due is named as a float."""
    from decimal import Decimal
    from fractions import Fraction

    assert Retention(Decimal("3600")).window_seconds == Decimal("3600")
    with pytest.raises(ValueError, match="not a Fraction"):
        Retention(Fraction(3600))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"not 5\.0 \(a float\)"):
        RetryPolicy(max_attempts=5.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not 1E"):
        Retention(Decimal("1e400"))  # type: ignore[arg-type]


def test_no_back_off_stays_none_after_very_many_attempts() -> None:
    policy = RetryPolicy(initial_delay=0, max_attempts=5000)
    assert policy.delay(1000) == 0.0
    assert policy.delay(1100) == 0.0  # the overflow fallback used to give max_delay (30 s)


def test_inbox_run_waits_the_first_back_off_it_was_given() -> None:
    from outboxkit.inbox.worker import inbox_settings
    from outboxkit.settings.models import ConsumerSettings

    consumer = ConsumerSettings(name="c", group="g", topics=["t"], handler="m:f", retry_delay=60)
    policy = inbox_settings(consumer, "outboxkit").policy
    assert policy.delay(1) == 60.0  # was capped by the default max_delay, 30 s


def test_copy_min_rows_is_an_integer_of_at_least_two() -> None:
    with pytest.raises(ConfigurationError, match="copy_min_rows"):
        OutboxConfig(copy_min_rows=math.nan)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="copy_min_rows"):
        OutboxConfig(copy_min_rows=1)
    assert OutboxConfig(copy_min_rows=None).copy_min_rows is None
