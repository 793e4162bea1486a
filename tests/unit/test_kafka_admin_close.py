"""A confluent admin call left running (a read the relay gave up on, in a thread) ends after the
admin was closed: the relay stopped, and ``asyncio.run`` cancels what is left. Its clean-up
asked the closed admin for its client and raised ``PublishError("admin client already
closed")`` in place of the cancellation: "unhandled exception during asyncio.run() shutdown"."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from outboxkit.kafka.api import LIMIT_NAMES
from outboxkit.kafka.confluent_admin import ConfluentAdmin
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit


class _Stalled:
    """An admin client whose configuration read blocks its thread until ``go``."""

    def __init__(self) -> None:
        self.entered, self.go = threading.Event(), threading.Event()

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Any]:
        self.entered.set()
        self.go.wait()
        raise AssertionError("not reached: the call was given up on")

    def poll(self, timeout: float) -> int:
        return 0


async def test_a_call_cancelled_after_the_admin_closed_ends_cancelled() -> None:
    admin = ConfluentAdmin(KafkaSettings.plaintext("127.0.0.1:1"), timeout=0.1)
    client = _Stalled()
    admin._client = client  # type: ignore[assignment]
    read = asyncio.ensure_future(admin.topic_configs("t", LIMIT_NAMES))
    try:
        await asyncio.to_thread(client.entered.wait)
        await admin.close()
        read.cancel()
        await asyncio.wait([read])
    finally:
        client.go.set()
    assert read.cancelled()
