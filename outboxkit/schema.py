"""Names the whole product shares: the schema, its LISTEN/NOTIFY channel, the consumer name's
limits, and the row states.

Every other module (SQL loader, CLI choices, read-backs, checks) takes these from here, so a
state or a name is spelled once. The migrations' CHECK constraints list the same values; a test
compares them.
"""

from __future__ import annotations

import re
from enum import StrEnum
from functools import cache
from hashlib import sha256

from outboxkit.errors import ConfigurationError, SchemaError

DEFAULT_SCHEMA = "outboxkit"
_SCHEMA_RE = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_MAX_CHANNEL_LENGTH = 63  # PostgreSQL identifiers (NAMEDATALEN - 1)
#: The longest consumer name or relay group, in UTF-8 bytes. A consumer name leads the inbox's
#: primary key, beside an event id of up to 1024 bytes, a relay group the relay lease's and
#: pause's, and travels in transactional ids and checkpoint keys: together far inside a btree
#: entry's limit (~2.7 KB), as a name that also labels metrics and log lines should be.
MAX_NAME_BYTES = 255


def validate_schema_name(schema: str) -> str:
    """The name, if it is a plain lower-case identifier (whole string: no trailing newline)."""
    if not isinstance(schema, str) or _SCHEMA_RE.fullmatch(schema) is None:
        raise SchemaError(f"invalid schema name {schema!r}: use lower-case letters, digits, _")
    return schema


def text_problem(value: object) -> str | None:
    """Why PostgreSQL cannot store ``value`` in a text column (NUL, a lone surrogate), or None."""
    if not isinstance(value, str):
        return f"must be a str, not a {type(value).__name__}"
    if "\x00" in value:
        return "contains a NUL character, which PostgreSQL cannot store"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 (a lone surrogate)"
    return None


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a consumer name or relay group, or None. A name PostgreSQL cannot
    store or index fails every claim (of inbox rows, of relay shards): nothing would ever end,
    retried each second."""
    problem = text_problem(name)
    if problem is not None or not isinstance(name, str):
        return problem
    if not name:
        return "is empty"
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        return f"is {size} bytes long (at most {MAX_NAME_BYTES} UTF-8 bytes)"
    return None


def _refuse(where: str, problem: str | None) -> None:
    """A :class:`ConfigurationError` naming ``where`` (never echoing the value) if refused."""
    if problem is not None:
        raise ConfigurationError(f"{where} {problem}")


def check_consumer_name(where: str, name: object) -> None:
    _refuse(where, name_problem(name))


def check_owner(where: str, owner: object) -> None:
    """The lease owner is stored by every claim: it must be text PostgreSQL can store."""
    _refuse(where, text_problem(owner))


def quoted(schema: str) -> str:
    """The schema as a quoted SQL identifier (validated first, so quoting cannot be escaped)."""
    return '"' + validate_schema_name(schema) + '"'


def parked_lock_name(schema: str = DEFAULT_SCHEMA) -> str:
    """The advisory lock (relay.sql's ``parked_lock``) that serialises what decides about held
    rows in ``schema``: a hold pass, ``outbox retry``/``discard``, a parked row's deletion."""
    return f"outboxkit parked rows {validate_schema_name(schema)}"


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
    SCHEDULED = "scheduled"  # pending, but not due before its deliver_after (migration 0008)
    HELD = "held"  # pending, but behind a parked row of its key (migration 0009)


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
