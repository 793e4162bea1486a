"""Consumer dedup middleware: each event's database effect once, every outcome readable back.

See ``docs/consumer.md`` for the guarantees and ``outboxkit.inbox.middleware`` for the design.
The Kafka adapters live in :mod:`outboxkit.inbox.confluent` and :mod:`outboxkit.inbox.aiokafka`
(imported on demand, so each client library stays optional).
"""

from __future__ import annotations

from outboxkit.inbox.context import HandlerContext
from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.middleware import AsyncInbox, Inbox, InboxSettings
from outboxkit.inbox.outcome import Outcome, OutcomeKind
from outboxkit.inbox.policy import RetryPolicy
from outboxkit.inbox.registry import EventRegistry

__all__ = [
    "AsyncInbox",
    "Envelope",
    "EventRegistry",
    "HandlerContext",
    "Inbox",
    "InboxSettings",
    "Outcome",
    "OutcomeKind",
    "RetryPolicy",
]
