"""A Kafka broker of a test module's own (a security set-up the dev stack's broker lacks)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from outboxkit.devstack import KafkaServer


def own_broker(**options: Any) -> Iterator[KafkaServer]:
    """A :class:`KafkaServer` made with ``options``, started (~4 s with the jars cached), then
    stopped and its directory removed: the body of a module-scoped fixture."""
    server = KafkaServer(**options)
    try:
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            server.destroy()
