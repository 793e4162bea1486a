"""The fenced relay: outbox rows to Kafka, exactly once into Kafka, nothing lost.

Its settings are :class:`outboxkit.settings.RelaySettings` (``[relay]``, ``OUTBOXKIT_RELAY_*``),
part of the one :class:`outboxkit.settings.Settings` model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from outboxkit.settings import Mode, OnPublish, ParkedKeyPolicy, RelaySettings

if TYPE_CHECKING:
    from outboxkit.relay.runner import Relay


def __getattr__(name: str) -> Any:
    # The runner imports prometheus_client and the Kafka seam; importing it lazily keeps
    # `import outboxkit.relay` (and the relay's control commands) light.
    if name == "Relay":
        from outboxkit.relay.runner import Relay

        return Relay
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Mode", "OnPublish", "ParkedKeyPolicy", "Relay", "RelaySettings"]
