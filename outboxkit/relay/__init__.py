"""The fenced relay: outbox rows to Kafka, exactly once into Kafka, nothing lost."""

from __future__ import annotations

from outboxkit.relay.config import (
    Mode,
    OnPublish,
    ParkedKeyPolicy,
    ProducerBackend,
    RelayConfig,
    load_config,
)
from outboxkit.relay.runner import Relay

__all__ = [
    "Mode",
    "OnPublish",
    "ParkedKeyPolicy",
    "ProducerBackend",
    "Relay",
    "RelayConfig",
    "load_config",
]
