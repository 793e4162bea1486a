"""outboxkit: the transactional outbox for PostgreSQL and Apache Kafka, done properly.

Application side (this module): write events on your SQLAlchemy transaction with
:class:`Outbox`. The relay lives in :mod:`outboxkit.relay`, the consumer dedup middleware in
:mod:`outboxkit.inbox`, test helpers in :mod:`outboxkit.testing`.
"""

from __future__ import annotations

from outboxkit.errors import (
    ConfigurationError,
    IdempotencyKeyConflictError,
    InvalidTopicError,
    LeaseLostError,
    OutboxkitError,
    PayloadTooLargeError,
    SchemaError,
    SerializationError,
    ValidationError,
)
from outboxkit.events import Event, EventSpec, Message
from outboxkit.flush_hook import DomainEvents, FlushHook
from outboxkit.ids import uuid7
from outboxkit.outbox import (
    DEFAULT_MAX_MESSAGE_BYTES,
    Outbox,
    OutboxConfig,
    WriteResult,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "ConfigurationError",
    "DomainEvents",
    "Event",
    "EventSpec",
    "FlushHook",
    "IdempotencyKeyConflictError",
    "InvalidTopicError",
    "LeaseLostError",
    "Message",
    "Outbox",
    "OutboxConfig",
    "OutboxkitError",
    "PayloadTooLargeError",
    "SchemaError",
    "SerializationError",
    "ValidationError",
    "WriteResult",
    "__version__",
    "uuid7",
]
