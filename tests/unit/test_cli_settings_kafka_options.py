"""``inbox run --kafka-option name=value``: a value stays the text given unless the property counts
a unit (``_ms``, ``_bytes``, ``_records``: aiokafka's numeric keyword arguments, which must be
``int``; confluent-kafka reads every value as text). Digits alone once made an ``int`` of any
value: a password of digits lost its leading zeros, a long one was refused as "Kafka clients keep
integers in 32 bits", and ``'12²'`` (``isdigit()`` but not ``int()``) ended in a traceback
quoting it.
"""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner, Result

from outboxkit.cli import main
from outboxkit.cli.inbox import _options
from outboxkit.settings import Settings

pytestmark = pytest.mark.unit

LONG_DIGITS = "0" + "9" * 40  # a password no 32-bit (or 64-bit) integer holds


def _run(monkeypatch: pytest.MonkeyPatch, *items: str) -> tuple[Result, list[Settings]]:
    """``inbox run`` up to the worker, which records the settings it was handed."""
    from outboxkit.inbox import worker

    handed: list[Settings] = []
    monkeypatch.setattr(worker, "run", handed.append)
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("OUTBOXKIT_")}
    env["OUTBOXKIT_CONSUMER_GC_TUNING"] = "false"
    args = ["inbox", "run", "--consumer", "c", "--group", "g", "--topic", "t"]
    args += ["--database-url", "postgresql://u@h/db", "--bootstrap", "h:9092"]
    for item in items:
        args += ["--kafka-option", item]
    return CliRunner(env=env).invoke(main, args), handed


def test_values_stay_text_unless_the_property_counts_a_unit() -> None:
    assert _options(
        (
            "sasl.password=000123",
            f"sasl_plain_password={LONG_DIGITS}",
            "client.id=0042",
            "group_instance_id=7",
            "sasl.password.extra=12²",
            "session_timeout_ms=6000",
            "session.timeout.ms=06000",
            "max_poll_records=500",
            "fetch.min.bytes=7",
            "topic.metadata.refresh.interval.ms=-1",
        )
    ) == {
        "sasl.password": "000123",
        "sasl_plain_password": LONG_DIGITS,
        "client.id": "0042",
        "group_instance_id": "7",
        "sasl.password.extra": "12²",
        "session_timeout_ms": 6000,
        "session.timeout.ms": 6000,
        "max_poll_records": 500,
        "fetch.min.bytes": 7,
        "topic.metadata.refresh.interval.ms": -1,
    }


def test_a_password_of_digits_reaches_the_client_as_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, handed = _run(
        monkeypatch,
        "sasl.oauthbearer.client.secret=000123",
        f"ssl.keystore.password={LONG_DIGITS}",
        "heartbeat_interval_ms=1000",
    )
    assert result.exit_code == 0, result.output
    (settings,) = handed
    assert settings.consumer.client_options() == {
        "sasl.oauthbearer.client.secret": "000123",
        "ssl.keystore.password": LONG_DIGITS,
        "heartbeat_interval_ms": 1000,
    }


@pytest.mark.parametrize("value", ["12²", "٣", "1.5", "6e3", "", "-", "0x10"])
def test_other_text_for_a_unit_property_is_refused_by_name_only(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    result, handed = _run(monkeypatch, f"fetch.min.bytes={value}")
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, ValueError)
    assert "Traceback" not in result.output
    assert "'fetch.min.bytes' takes a whole number" in result.output
    if len(value) > 1:  # '-' is in every usage line
        assert value not in result.output.replace("fetch.min.bytes", "")
    assert handed == []


def test_a_unit_property_beyond_32_bits_is_refused_by_name_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, handed = _run(monkeypatch, "fetch_max_bytes=98765432109")
    assert result.exit_code == 1, result.output
    assert "fetch_max_bytes" in result.output
    assert "98765432109" not in result.output
    assert handed == []


def test_a_value_isdigit_accepts_but_int_does_not_stays_text() -> None:
    """The old conversion raised ``ValueError: invalid literal for int() ... '12²'``."""
    assert _options(("sasl.password=12²",)) == {"sasl.password": "12²"}
