"""Reading a topic back the way a ``read_committed`` consumer sees it (test side only)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError


def read_topic(
    bootstrap: str, topic: str, *, expect: int, timeout: float = 60.0, quiet: float = 2.0
) -> list[Any]:
    """Every record (confluent-kafka ``Message``): until ``expect`` arrived, every partition was
    read to its end (the last stable offset: read_committed), and ``quiet`` seconds more passed
    with nothing new, so a duplicate would be caught too. Reading to the end first means an
    ``expect=0`` cannot pass on a quiet spell before the consumer even had its partitions."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.subscribe([topic])
    got: list[Any] = []
    at_end: set[int] = set()  # partitions read to their end, with nothing after
    assigned: set[int] = set()
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
                    at_end.add(msg.partition())
                    continue
                got.append(msg)
                at_end.discard(msg.partition())
                quiet_until = None
            assigned = {tp.partition for tp in consumer.assignment()}
            if len(got) >= expect and assigned and assigned <= at_end:
                quiet_until = quiet_until or time.monotonic() + quiet
                if time.monotonic() > quiet_until:
                    break
        else:
            if not (assigned and assigned <= at_end):
                raise AssertionError(f"never read {topic} to its end; got {len(got)} record(s)")
    finally:
        consumer.close()
    return got
