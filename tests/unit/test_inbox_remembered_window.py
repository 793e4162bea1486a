"""`inbox run` compares the topics' retention with how long events are remembered, including
when no dedup window is set and only the purge (on by default) decides it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from outboxkit.errors import PublishError
from outboxkit.inbox import worker
from outboxkit.inbox.worker import remembered_for
from outboxkit.settings import ConsumerSettings, KafkaSettings

pytestmark = pytest.mark.unit


def test_the_purge_window_is_checked_when_no_dedup_window_is_set() -> None:
    assert remembered_for(ConsumerSettings()) == 7 * 24 * 3600.0
    assert remembered_for(ConsumerSettings(retention_window=3600)) == 3600


def test_a_dedup_window_is_checked_as_set() -> None:
    assert remembered_for(ConsumerSettings(dedup_window=60, retention_window=3600)) == 60


def test_nothing_to_check_when_rows_are_never_purged() -> None:
    assert remembered_for(ConsumerSettings(retention_window=0)) is None


class _RefusingAdmin:
    """An admin client whose DescribeConfigs is refused (a role without that ACL)."""

    async def topic_config(self, topic: str, name: str) -> str | None:
        raise PublishError(f"configuration of topic {topic!r}: TOPIC_AUTHORIZATION_FAILED")

    async def close(self) -> None:
        return None


class _Clients:
    def __init__(self, kafka: KafkaSettings) -> None:
        pass

    def admin(self) -> _RefusingAdmin:
        return _RefusingAdmin()


def test_a_refused_retention_check_only_warns_when_the_purge_alone_asked_for_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Checked because the purge is on (no dedup window asked for): a consumer whose role may
    not read topic configurations must still start, or it would wait for Kafka for ever."""
    monkeypatch.setattr(worker, "KafkaClients", _Clients)
    kafka = KafkaSettings(bootstrap="127.0.0.1:9092")
    with caplog.at_level(logging.WARNING, logger="outboxkit.inbox.worker"):
        asyncio.run(worker._check_window(kafka, ConsumerSettings(topics=["orders"])))
    assert "topic retention not checked against the purge window" in caplog.text
    with pytest.raises(PublishError):  # a dedup window was asked for: start-up waits for it
        asyncio.run(worker._check_window(kafka, ConsumerSettings(topics=["t"], dedup_window=60)))
