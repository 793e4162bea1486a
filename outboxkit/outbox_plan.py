"""The writer's logic without I/O: plan the statements of one call and read their replies.

Items become rows in :mod:`outboxkit.outbox_row` (``prepare``: everything that can be refused is
refused before anything is sent). A ``Plan`` is one add/add_many call: which statement to run
next, and what its rows mean. The sync and async executors in :mod:`outboxkit.outbox` drive
the same plan.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from outboxkit.bounds import check_range
from outboxkit.errors import ConfigurationError, IdempotencyKeyConflictError, ValidationError
from outboxkit.limits import DEFAULT_MAX_MESSAGE_BYTES, MESSAGE_MAX_BYTES_RANGE
from outboxkit.outbox_row import Row, Writable, prepare
from outboxkit.schema import DEFAULT_SCHEMA, notify_channel, validate_schema_name

_MAX_REREADS = 5
#: The most one INSERT of ``add_many`` carries, in bytes as ``_row_bytes`` counts them: larger
#: calls are written by several INSERTs in the call's savepoint. PostgreSQL closes the
#: connection on a protocol message over 1 GB, and the server holds the message, its arrays and
#: their casts at once: a quarter of that keeps one statement's memory in bounds.
INSERT_MAX_BYTES = 256 * 2**20
_ROW_FRAMING_BYTES = 256  # a uuid, a digest, an integer, a timestamp and each array entry's header
#: From this many rows on, add_many COPYs (measured in benchmarks/writes.py; see docs/writes.md).
DEFAULT_COPY_MIN_ROWS = 100

__all__ = [
    "Folding",
    "OutboxConfig",
    "Plan",
    "Row",
    "Statement",
    "Writable",
    "WriteResult",
    "prepare",
]

Statement = tuple[str, dict[str, Any]]  # (name in db/sql/outbox.sql, parameters)


@dataclass(frozen=True)
class OutboxConfig:
    """How the writer writes.

    ``notify``: send a transactional ``pg_notify`` (delivered on commit) so relays wake early;
    at most one per transaction and shard. Each notifying transaction takes PostgreSQL's global
    notify-queue lock at commit; switch it off when relays poll often enough.

    ``copy_min_rows``: ``add_many`` COPYs batches of at least this many new rows (same
    results and guarantees, less work per row); ``None`` never does.

    ``max_message_bytes``: the relay producer's ``message.max.bytes``. A message whose Kafka
    record (key, payload, every header, framing: :mod:`outboxkit.limits`) is larger is refused
    here rather than parked by the relay. Raise it only together with the producer's setting and
    the topics' ``max.message.bytes``; at most 1,000,000,000 (librdkafka's largest).
    """

    schema: str = DEFAULT_SCHEMA
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    notify: bool = True
    copy_min_rows: int | None = DEFAULT_COPY_MIN_ROWS

    def __post_init__(self) -> None:
        validate_schema_name(self.schema)
        # NaN, inf or more than any producer takes would refuse nothing here: the relay would
        # park the message and hold back every later one with its key.
        high = MESSAGE_MAX_BYTES_RANGE[1]
        name = "OutboxConfig.max_message_bytes"
        check_range(name, self.max_message_bytes, 1, high, integer=True, error=ConfigurationError)
        if self.copy_min_rows is not None:
            name = "OutboxConfig.copy_min_rows (None: never COPY)"
            check_range(name, self.copy_min_rows, 2, integer=True, error=ConfigurationError)


@dataclass(frozen=True)
class WriteResult:
    """The outcome of one add: ``duplicate`` means the key existed with the same content and
    nothing was written; ``event_id`` is then the existing event's id. ``id`` is the new row's id
    (``None`` for duplicates)."""

    event_id: uuid.UUID
    duplicate: bool
    id: int | None = None


class Folding:
    """Repeats of an idempotency key within one call, folded onto its first occurrence (same
    content) or refused (other content); two distinct rows must not share an event id."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
        self.first_of: list[int] = []
        self.unique: list[int] = []
        self._seen: dict[str, int] = {}
        self._event_ids: set[int] = set()

    def add(self, row: Row) -> bool:
        """Take the next row of the call; True if it is the first of its key."""
        index = len(self.rows)
        self.rows.append(row)
        first = self._seen.get(row.idempotency_key)
        if first is None:
            event_id = row.event_id.int  # an int hashes in C, a UUID in Python
            if event_id in self._event_ids:
                raise ValidationError(f"event id {row.event_id} appears twice in one call")
            self._event_ids.add(event_id)
            self._seen[row.idempotency_key] = index
            self.unique.append(index)
            self.first_of.append(index)
            return True
        if self.rows[first].content_digest != row.content_digest:
            raise IdempotencyKeyConflictError(
                f"idempotency key {row.idempotency_key!r} is used twice in one call"
                " with different content",
                idempotency_key=row.idempotency_key,
            )
        self.first_of.append(first)
        return False


class Plan:
    """One add/add_many call: the prepared rows, their results, and the SQL still to run.

    The sync and async entry points drive the same plan; only the ``execute`` differs.
    """

    def __init__(self, config: OutboxConfig, rows: Sequence[Row] | Folding) -> None:
        self.config = config
        if isinstance(rows, Folding):
            folding = rows
        else:
            folding = Folding()
            for row in rows:
                folding.add(row)
        self.rows: Sequence[Row] = folding.rows
        self.first_of, self.unique = folding.first_of, folding.unique
        self.results: dict[int, WriteResult] = {}
        self.conflict: IdempotencyKeyConflictError | None = None
        self.rereads = 0
        self.sent: list[int] = []  # the rows of the last INSERT
        self.xact: str | None = None
        self.notified: set[int] = set()

    @property
    def needs_savepoint(self) -> bool:
        """Whether a conflict could leave rows of this call written (then they are undone by
        rolling back to a savepoint): only with two or more distinct rows."""
        return len(self.unique) > 1

    def pending(self) -> list[int]:
        return [i for i in self.unique if i not in self.results]

    def insert_statement(self, notified: tuple[str | None, list[int]]) -> Statement:
        """The INSERT of the next rows still to write, at most ``INSERT_MAX_BYTES`` of them
        (at least one row)."""
        self.sent = self._next_rows()
        todo = [self.rows[i] for i in self.sent]
        if self.config.notify:
            suffix = ""
            xact, shards = notified
            if self.xact is not None:  # an earlier INSERT of this call notified these
                shards = sorted(self.notified.union(shards if xact == self.xact else ()))
                xact = self.xact
            common = {
                "channel": notify_channel(self.config.schema),
                "notified_xact": xact,
                "notified_shards": shards,
            }
        else:
            suffix, common = "_silent", {}
        if len(todo) == 1:
            return "insert_one" + suffix, {**common, **todo[0]._asdict()}
        arrays = {
            name: list(column)
            for name, column in zip(_ARRAY_PARAMS, zip(*todo, strict=True), strict=True)
        }
        return "insert_many" + suffix, {**common, **arrays}

    def _next_rows(self) -> list[int]:
        pending = self.pending()
        if len(pending) == 1:
            return pending
        rows, budget = self.rows, INSERT_MAX_BYTES
        taken: list[int] = []
        for index in pending:
            budget -= _row_bytes(rows[index])
            if budget < 0 and taken:
                break
            taken.append(index)
        return taken

    def take_inserted(self, result_rows: Sequence[Any]) -> None:
        """Record the rows an insert wrote (and, with notify on, the shards it notified)."""
        by_event_id = {self.rows[i].event_id: i for i in self.sent}
        for row_id, event_id, *notify in result_rows:
            self.results[by_event_id[event_id]] = WriteResult(
                event_id=event_id, duplicate=False, id=row_id
            )
            if notify:
                shard, self.xact, notified = notify
                if notified:
                    self.notified.add(shard)

    def take_copied(self, indexes: Sequence[int], ids: Sequence[int]) -> None:
        """Record rows written by COPY (all of them were, or the COPY failed)."""
        rows, results = self.rows, self.results
        for index, row_id in zip(indexes, ids, strict=True):
            results[index] = WriteResult(rows[index].event_id, False, row_id)  # positional: cheaper

    def _unsettled(self) -> list[int]:
        """The last INSERT's rows it did not write: their keys are taken."""
        return [i for i in self.sent if i not in self.results]

    def reread_statement(self) -> Statement | None:
        todo = self._unsettled()
        if not todo or self.conflict is not None:
            return None
        return "select_by_idempotency_keys", {
            "idempotency_keys": [self.rows[i].idempotency_key for i in todo]
        }

    def take_reread(self, result_rows: Sequence[Any]) -> None:
        by_key = {self.rows[i].idempotency_key: i for i in self._unsettled()}
        for key, event_id, digest in result_rows:
            self._existing(by_key[key], event_id, bytes(digest))

    def needs_retry(self) -> bool:
        """Rows still to write: the next INSERT's, or rows whose conflicting row vanished
        (deleted) between insert and re-read. Called once after each INSERT (and its re-read):
        it counts the rounds that left rows unsettled."""
        if self.conflict is not None or not self.pending():
            return False
        if self._unsettled():
            self.rereads += 1
            if self.rereads >= _MAX_REREADS:  # give up; the caller undoes this call's rows
                self.conflict = IdempotencyKeyConflictError(
                    "could not settle the idempotency keys of this call (rows keep disappearing)"
                )
                return False
        return True

    def outcome(self) -> list[WriteResult]:
        """The results in input order, or the conflict (raised inside the call's savepoint,
        so that rolling back to it undoes the rows this call wrote)."""
        if self.conflict is not None:
            raise self.conflict
        out = []
        for index, first in enumerate(self.first_of):
            result = self.results[first]
            if index != first:
                result = dataclasses.replace(result, duplicate=True, id=None)
            out.append(result)
        return out

    def _existing(self, index: int, event_id: uuid.UUID, digest: bytes) -> None:
        row = self.rows[index]
        if digest == row.content_digest:
            self.results[index] = WriteResult(event_id=event_id, duplicate=True)
        elif self.conflict is None:
            self.conflict = IdempotencyKeyConflictError(
                f"idempotency key {row.idempotency_key!r} was already used for different"
                f" content (event {event_id})",
                idempotency_key=row.idempotency_key,
                existing_event_id=event_id,
            )


def _row_bytes(row: Row) -> int:
    """What one row adds to an INSERT: psycopg sends it in the binary format, text as UTF-8."""
    return (
        len(row.payload)
        + _utf8_bytes(row.headers)  # JSON that keeps non-ASCII characters as they are
        + _utf8_bytes(row.idempotency_key)
        + _utf8_bytes(row.topic)
        + _utf8_bytes(row.message_key)
        + _utf8_bytes(row.content_type)
        + _utf8_bytes(row.event_type)
        + _utf8_bytes(row.aggregate_type)
        + _utf8_bytes(row.aggregate_id)
        + _ROW_FRAMING_BYTES
    )


def _utf8_bytes(text: str | None) -> int:
    if text is None:
        return 0
    return len(text) if text.isascii() else len(text.encode())


# insert_many's array parameters, in Row's field order.
_ARRAY_PARAMS = (
    "event_ids", "idempotency_keys", "content_digests", "topics", "message_keys", "payloads",
    "content_types", "headers", "event_types", "schema_versions", "aggregate_types",
    "aggregate_ids", "deliver_afters",
)  # fmt: skip
