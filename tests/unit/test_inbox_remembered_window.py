"""`inbox run` compares the topics' retention with how long events are remembered, including
when no dedup window is set and only the purge (on by default) decides it."""

from __future__ import annotations

import pytest

from outboxkit.inbox.worker import remembered_for
from outboxkit.settings import ConsumerSettings

pytestmark = pytest.mark.unit


def test_the_purge_window_is_checked_when_no_dedup_window_is_set() -> None:
    assert remembered_for(ConsumerSettings()) == 7 * 24 * 3600.0
    assert remembered_for(ConsumerSettings(retention_window=3600)) == 3600


def test_a_dedup_window_is_checked_as_set() -> None:
    assert remembered_for(ConsumerSettings(dedup_window=60, retention_window=3600)) == 60


def test_nothing_to_check_when_rows_are_never_purged() -> None:
    assert remembered_for(ConsumerSettings(retention_window=0)) is None
