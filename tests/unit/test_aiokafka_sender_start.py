"""A dead-letter/acks sender whose producer cannot start leaves no client behind for the garbage
collector to find (an unclosed producer or socket surfaces later, in some other test)."""

from __future__ import annotations

import asyncio
import gc
import socket
import warnings

import pytest

from outboxkit.errors import PublishError
from outboxkit.kafka import KafkaClients
from outboxkit.settings import KafkaSettings

pytestmark = pytest.mark.unit


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_failed_start_closes_the_producer() -> None:
    pytest.importorskip("aiokafka")
    settings = KafkaSettings(bootstrap=f"127.0.0.1:{_closed_port()}", client="aiokafka")

    async def send_once() -> None:
        sender = KafkaClients(settings, timeout=5.0).async_record_sender()
        with pytest.raises(PublishError):
            await sender.send("t", b"k", b"v", [])
        await sender.close()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(send_once())
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []
