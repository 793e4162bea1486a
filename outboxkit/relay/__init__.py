"""The fenced relay: outbox rows to Kafka, exactly once into Kafka, nothing lost."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outboxkit.relay.config import (
    Mode,
    OnPublish,
    ParkedKeyPolicy,
    ProducerBackend,
    RelayConfig,
    load_config,
)

if TYPE_CHECKING:
    from outboxkit.relay.runner import Relay


def __getattr__(name: str) -> Any:
    # The runner needs a Kafka client (outboxkit[confluent] or outboxkit[aiokafka]); importing it
    # lazily keeps `outboxkit migrate` and the relay's configuration usable without one.
    if name == "Relay":
        from outboxkit.relay.runner import Relay

        return Relay
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Mode",
    "OnPublish",
    "ParkedKeyPolicy",
    "ProducerBackend",
    "Relay",
    "RelayConfig",
    "load_config",
]
