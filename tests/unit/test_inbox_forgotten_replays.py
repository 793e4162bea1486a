"""`inbox run` says at start-up that purged events are forgotten when no dedup window refuses
their replays (the purge is on by default), without asking Kafka for anything."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from outboxkit.inbox.worker import retention
from outboxkit.settings import ConsumerSettings

pytestmark = pytest.mark.unit

SAID = "no dedup window is set"


def _said(consumer: ConsumerSettings, caplog: pytest.LogCaptureFixture) -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="outboxkit.inbox.worker"):
        retention(consumer)
    return caplog.text


def test_the_default_purge_without_a_dedup_window_is_said(caplog: pytest.LogCaptureFixture) -> None:
    text = _said(ConsumerSettings(), caplog)
    assert SAID in text
    assert "604800 s" in text
    assert "OUTBOXKIT_CONSUMER_DEDUP_WINDOW" in text


def test_nothing_said_with_a_dedup_window_or_without_a_purge(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert SAID not in _said(ConsumerSettings(dedup_window=60), caplog)
    assert _said(ConsumerSettings(retention_window=0), caplog) == ""


def test_a_sigterm_during_a_start_up_check_that_then_passes_ends_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start-up checks run under their own signal handlers: a SIGTERM that arrived while a
    check ran (a slow Kafka) must end the process once it returns, not be forgotten."""
    from outboxkit.inbox import startup, worker

    def terminated_during_the_check(config: object, check: object, stop: object) -> bool:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler _started installed sets its stop
        return True

    monkeypatch.setattr(startup, "wait_until_ready", terminated_during_the_check)
    assert worker._started(None) is False  # type: ignore[arg-type]
