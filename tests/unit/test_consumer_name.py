"""A consumer name or relay group PostgreSQL cannot store (NUL, a lone surrogate) or index
(longer than a btree entry takes) failed every claim, retried each second forever: nothing ever
ended. It is refused when the settings are built, naming the setting, never the name."""

from __future__ import annotations

import os
import re

import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.errors import ConfigurationError
from outboxkit.inbox import EventRegistry, InboxSettings
from outboxkit.schema import MAX_NAME_BYTES
from outboxkit.settings import load_settings

pytestmark = pytest.mark.unit

REGISTRY = EventRegistry()
LONGEST = "é" * (MAX_NAME_BYTES // 2) + "x"  # 255 bytes, 128 characters
BAD = {
    "nul": ("billing\x00", "NUL character"),
    "surrogate": ("billing\ud800", "lone surrogate"),
    "too_long": ("x" * 3000, "3000 bytes long (at most 255 UTF-8 bytes)"),
    "too_long_utf8": (LONGEST + "é", "257 bytes long"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_inbox_settings_refuse_a_name_postgresql_cannot_keep(case: str) -> None:
    name, problem = BAD[case]
    with pytest.raises(ConfigurationError, match=re.escape(problem)) as caught:
        InboxSettings(consumer=name, registry=REGISTRY)
    assert str(caught.value).startswith("InboxSettings.consumer ")
    assert "billing" not in str(caught.value)


def test_inbox_settings_refuse_an_empty_or_non_text_name_and_owner() -> None:
    with pytest.raises(ConfigurationError, match=r"InboxSettings\.consumer is empty"):
        InboxSettings(consumer="", registry=REGISTRY)
    with pytest.raises(ConfigurationError, match="must be a str, not a bytes"):
        InboxSettings(consumer=b"c", registry=REGISTRY)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"InboxSettings\.owner contains a NUL"):
        InboxSettings(consumer="c", registry=REGISTRY, owner="host\x00:1")


def test_the_limit_counts_utf8_bytes_and_the_longest_name_passes() -> None:
    assert len(LONGEST.encode()) == MAX_NAME_BYTES
    assert InboxSettings(consumer=LONGEST, registry=REGISTRY).consumer == LONGEST
    assert InboxSettings(consumer="billing v2 / eu", registry=REGISTRY).consumer
    with pytest.raises(ConfigurationError, match="256 bytes long"):
        InboxSettings(consumer=LONGEST + "x", registry=REGISTRY)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("OUTBOXKIT_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("case", sorted(BAD))
def test_the_consumer_settings_refuse_it_naming_the_setting(case: str) -> None:
    name, problem = BAD[case]
    with pytest.raises(ConfigurationError, match=re.escape(problem)) as caught:
        load_settings(overrides={"consumer": {"name": name}})
    assert "OUTBOXKIT_CONSUMER_NAME ([consumer] name): Value error, the consumer name " in str(
        caught.value
    )
    assert "billing" not in str(caught.value)
    assert load_settings(overrides={"consumer": {"name": ""}}).consumer.missing()


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("case", ["nul", "too_long"])
def test_inbox_run_ends_in_one_line_naming_the_setting(case: str) -> None:
    args = ["inbox", "run", "--consumer", BAD[case][0], "--group", "g", "--topic", "t"]
    result = CliRunner().invoke(main, [*args, "--handler", "json:dumps"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert "OUTBOXKIT_CONSUMER_NAME" in result.output
    assert BAD[case][1] in result.output


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("case", sorted(BAD))
def test_the_relay_group_is_refused_alike(case: str) -> None:
    """The relay group leads the relay lease's primary key: the same limits."""
    name, problem = BAD[case]
    if case == "surrogate":  # pydantic's own str check refuses it first
        problem = "Input should be a valid string"
    with pytest.raises(ConfigurationError, match=re.escape(problem)) as caught:
        load_settings(overrides={"relay": {"group": name}})
    assert "OUTBOXKIT_RELAY_GROUP ([relay] group): " in str(caught.value)
    assert "billing" not in str(caught.value)
    assert load_settings(overrides={"relay": {"group": LONGEST}}).relay.group == LONGEST


@pytest.mark.usefixtures("clean_env")
def test_relay_run_ends_in_one_line_naming_the_group_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOXKIT_RELAY_GROUP", "x" * 3000)
    result = CliRunner().invoke(main, ["relay", "run"])
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    assert "OUTBOXKIT_RELAY_GROUP" in result.output
    assert "3000 bytes long" in result.output
