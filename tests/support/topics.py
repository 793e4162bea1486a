"""Reading a topic back the way a ``read_committed`` consumer sees it (test side only)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError


def read_topic(
    bootstrap: str, topic: str, *, expect: int, timeout: float = 60.0, quiet: float = 2.0
) -> list[Any]:
    """Every record (confluent-kafka ``Message``): until ``expect`` arrived and ``quiet`` seconds
    more passed with nothing new, so a duplicate would be caught too."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    quiet_until: float | None = None
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise AssertionError(f"consumer error: {error}")
                    continue
                got.append(msg)
                quiet_until = None
            if len(got) >= expect:
                quiet_until = quiet_until or time.monotonic() + quiet
                if time.monotonic() > quiet_until:
                    break
    finally:
        consumer.close()
    return got
