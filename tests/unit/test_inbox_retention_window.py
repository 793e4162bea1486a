"""``inbox run`` keeps dedup rows at least as long as its dedup window accepts replays, and
``inbox purge`` purges one consumer's rows unless told every consumer's, before any database."""

from __future__ import annotations

import logging
import os

import pytest
from click.testing import CliRunner

from outboxkit.cli import main
from outboxkit.inbox.retention import Purger, Retention
from outboxkit.inbox.worker import inbox_settings, retention
from outboxkit.settings import ConsumerSettings

pytestmark = pytest.mark.unit


def test_a_retention_window_shorter_than_the_dedup_window_is_raised_to_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A replay inside the dedup window is accepted and only its row tells it from a new event:
    purging the row sooner would let the replay be applied again. ``inbox run`` builds the
    loop's purger from these two (the dedup window is the inbox's replay window)."""
    consumer = ConsumerSettings(
        name="c",
        group="g",
        topics=["t"],
        handler="builtins:print",
        dedup_window=7200,
        retention_window=3600,
    )
    settings = inbox_settings(consumer)
    with caplog.at_level(logging.WARNING, logger="outboxkit.inbox.retention"):
        purger = Purger(
            "s", retention(consumer), 0.0, consumer="c", replay_window=settings.replay_window
        )
    assert purger.retention is not None
    assert purger.retention.window_seconds == 7200
    assert "purged 7200 s after they finish instead" in caplog.text


def test_a_retention_window_at_least_the_dedup_window_is_kept_as_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="outboxkit.inbox.worker"):
        for window in (7200, 9000):
            purge = retention(ConsumerSettings(dedup_window=7200, retention_window=window))
            assert purge is not None
            assert purge.window_seconds == window
    assert caplog.text == ""
    assert retention(ConsumerSettings(dedup_window=7200, retention_window=0)) is None


def test_the_loop_purger_keeps_rows_at_least_the_replay_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The library adapters' ``retention=`` meets ``InboxSettings.replay_window`` in the loop's
    purger: the same rule as ``inbox run``'s."""
    with caplog.at_level(logging.WARNING, logger="outboxkit.inbox.retention"):
        short = Purger("s", Retention(3600), 0.0, consumer="c", replay_window=7200)
        longer = Purger("s", Retention(9000), 0.0, consumer="c", replay_window=7200)
        unset = Purger("s", Retention(3600), 0.0, consumer="c")
    windows = [p.retention.window_seconds if p.retention else None for p in (short, longer, unset)]
    assert windows == [7200, 9000, 3600]
    assert caplog.text.count("purged 7200 s after they finish instead") == 1


@pytest.mark.parametrize(
    "choice", [[], ["--consumer", "billing", "--all-consumers"]], ids=["neither", "both"]
)
def test_inbox_purge_refuses_to_guess_whose_rows(choice: list[str]) -> None:
    env = {name: None for name in os.environ if name.startswith("OUTBOXKIT_")}
    result = CliRunner(env=env).invoke(main, ["inbox", "purge", "--older-than", "60", *choice])
    assert result.exit_code == 2, result.output
    assert "give either --consumer NAME or --all-consumers" in result.output
    assert "database" not in result.output.lower()  # refused before looking for one
