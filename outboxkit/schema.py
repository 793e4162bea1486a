"""Names the whole product shares: the schema, its LISTEN/NOTIFY channel, and the row states.

Every other module (SQL loader, CLI choices, read-backs, checks) takes these from here, so a
state or a name is spelled once. The migrations' CHECK constraints list the same values; a test
compares them.
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import cache
from hashlib import sha256

from outboxkit.errors import SchemaError

DEFAULT_SCHEMA = "outboxkit"
_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_MAX_CHANNEL_LENGTH = 63  # PostgreSQL identifiers (NAMEDATALEN - 1)


def validate_schema_name(schema: str) -> str:
    """The name, if it is a plain lower-case identifier (whole string: no trailing newline)."""
    if not isinstance(schema, str) or _SCHEMA_RE.fullmatch(schema) is None:
        raise SchemaError(f"invalid schema name {schema!r}: use lower-case letters, digits, _")
    return schema


def quoted(schema: str) -> str:
    """The schema as a quoted SQL identifier (validated first, so quoting cannot be escaped)."""
    return '"' + validate_schema_name(schema) + '"'


@cache
def notify_channel(schema: str = DEFAULT_SCHEMA) -> str:
    """The LISTEN/NOTIFY channel writers notify for ``schema``; the payload is the shard number."""
    validate_schema_name(schema)
    channel = f"{schema}.outbox"
    if len(channel) > _MAX_CHANNEL_LENGTH:  # pg_notify refuses longer names
        channel = f"{schema[:40]}_{sha256(schema.encode()).hexdigest()[:12]}.outbox"
    return channel


class OutboxState(StrEnum):
    """``outbox_message.state``."""

    PENDING = "pending"
    PUBLISHED = "published"
    PARKED = "parked"
    DISCARDED = "discarded"


class InboxState(StrEnum):
    """``inbox_message.state``; every state but ``processing`` is terminal and never overwritten."""

    PROCESSING = "processing"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    REJECTED = "rejected"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self is not InboxState.PROCESSING


TERMINAL_INBOX_STATES = frozenset(s for s in InboxState if s.terminal)
