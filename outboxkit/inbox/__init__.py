"""Consumer dedup middleware: each event's database effect once, every outcome readable back.

See ``docs/consumer.md`` for the guarantees. One sans-IO core decides (``delivery``: one
delivery; ``loop``: the consumer loop; ``lease``: renewals), thin drivers execute: :class:`Inbox`
(sync) and :class:`AsyncInbox`; the Kafka adapters :mod:`outboxkit.inbox.confluent` and
:mod:`outboxkit.inbox.aiokafka` (each client library stays optional).
"""

from __future__ import annotations

from outboxkit.inbox.context import BatchContext, HandlerContext
from outboxkit.inbox.delivery import InboxSettings
from outboxkit.inbox.envelope import Envelope
from outboxkit.inbox.middleware import AsyncInbox, Inbox
from outboxkit.inbox.outcome import Outcome, OutcomeKind
from outboxkit.inbox.policy import RetryPolicy
from outboxkit.inbox.registry import EventRegistry

__all__ = [
    "AsyncInbox",
    "BatchContext",
    "Envelope",
    "EventRegistry",
    "HandlerContext",
    "Inbox",
    "InboxSettings",
    "Outcome",
    "OutcomeKind",
    "RetryPolicy",
]
