"""add_many's COPY path, without I/O: when to take it and what it sends.

Large batches are copied straight into the outbox table instead of bound as arrays to an
``INSERT .. ON CONFLICT``: psycopg formats COPY rows in C, the server skips the speculative
insertion, and the items are prepared while the COPY streams (:class:`Stream`). A COPY cannot
compute the shard, return ids or skip taken keys. So the shard is computed here by the exact
twin of the SQL function ``outbox_shard`` (the count read in the same transaction), the ids are
taken from the table's identity before the COPY and sent with the rows (nothing is read back;
a role that may not write ids gets them read back instead, :class:`CopiedIds`), and a taken key
or event id fails the COPY: the writer rolls back to its savepoint and inserts
the same items with ``ON CONFLICT`` instead, so duplicates and conflicts come out as on that
path.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from outboxkit.ids import uuid7_batch, uuid_text
from outboxkit.outbox_plan import Folding, OutboxConfig, Plan, Statement, Writable, prepare
from outboxkit.schema import notify_channel


def shard_of(message_key: str | None, event_id: uuid.UUID, shard_count: int) -> int:
    """``outbox_shard`` in Python: the first 32 bits of md5(key, else the event id as text),
    as a signed integer, masked to 31 bits, modulo the count (UTF-8 text, as the server's)."""
    if shard_count == 1:  # the default: anything modulo 1 is 0, no hash needed
        return 0
    text = message_key if message_key is not None else uuid_text(event_id)
    first32 = int.from_bytes(hashlib.md5(text.encode()).digest()[:4], "big")
    return (first32 & 0x7FFFFFFF) % shard_count


def worth_copying(config: OutboxConfig, items: Sequence[Writable]) -> bool:
    """The COPY path pays one more short statement than the INSERT path (two with notify: one
    NOTIFY per shard); it costs less from about 100 rows on."""
    return config.copy_min_rows is not None and len(items) >= config.copy_min_rows


COPY_LOCK: Statement = ("copy_lock", {})


def copy_setting(items: Sequence[Writable]) -> Statement:
    """Reads the shard count and the encoding, and takes one id per item."""
    return "copy_setting", {"rows": len(items)}


class Stream:
    """add_many's items, prepared one by one while the COPY sends them: PostgreSQL stores the
    rows already sent while Python validates and serialises the next ones (the two cores work
    at once). Validation, folding of repeated keys and refusals happen as on the INSERT path;
    an error stops the COPY, and the caller's savepoint takes back what was sent. Each row sent
    carries the next of ``ids`` (taken in increasing order), so ids follow input order as on
    the INSERT path; without ``ids`` the identity numbers the rows as they arrive."""

    def __init__(
        self,
        items: Sequence[Writable],
        config: OutboxConfig,
        trace_headers: Mapping[str, str],
        shard_count: int,
        ids: Sequence[int] | None,
    ) -> None:
        if ids is not None and len(ids) != len(items):
            raise AssertionError("one id per item is taken before the COPY")
        self.items, self.config, self.trace_headers = items, config, trace_headers
        self.shard_count, self.ids = shard_count, ids
        self.folding = Folding()
        self.shards: set[int] = set()
        self.sent = 0

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        config, trace_headers, shard_count = self.config, self.trace_headers, self.shard_count
        add, shards, ids = self.folding.add, self.shards, self.ids
        for item, new_id in zip(self.items, uuid7_batch(len(self.items)), strict=True):
            row = prepare(item, config, trace_headers, new_id)
            if add(row):
                shard = shard_of(row.message_key, row.event_id, shard_count)
                shards.add(shard)
                if ids is None:
                    yield (*row, shard)
                else:
                    self.sent += 1
                    yield (*row, shard, ids[self.sent - 1])

    @property
    def query_name(self) -> str:
        return "copy_rows" if self.ids is not None else "copy_rows_default_ids"

    def plan(self) -> Plan:
        """The call's plan, once every item went through the COPY (each row has its id)."""
        if len(self.folding.rows) != len(self.items):
            raise AssertionError("the COPY stopped before the last item")
        plan = Plan(self.config, self.folding)
        if self.ids is not None:
            plan.take_copied(plan.pending(), self.ids[: self.sent])
        return plan


class CopiedIds:
    """Reads back the ids of rows the identity numbered (the role may not write ids), in
    input order: by an id range first (cheap), by event id when the range did not hold them
    all. Nothing to read when the ids went with the rows."""

    def __init__(self, plan: Plan, after_id: int | None) -> None:
        self.plan, self.after_id = plan, after_id
        self.todo = plan.pending()
        self._tried_range = False
        self._done = not self.todo

    def statement(self) -> Statement | None:
        if self._done:
            return None
        if not self._tried_range:
            return "copied_ids", {"after_id": self.after_id}
        event_ids = [self.plan.rows[i].event_id for i in self.todo]
        return "copied_ids_by_event_id", {"event_ids": event_ids}

    def take(self, result_rows: Sequence[Any]) -> None:
        ids = [row_id for (row_id,) in result_rows]
        if not self._tried_range:
            self._tried_range = True
            if len(ids) != len(self.todo):  # ids from a sequence cache: ask by event id
                return
        elif len(ids) != len(self.todo) or None in ids:
            raise AssertionError("a copied row was not found again")  # cannot happen: same tx
        self.plan.take_copied(self.todo, ids)
        self._done = True


def notify_statement(
    plan: Plan, shards: set[int], notified: tuple[str | None, list[int]]
) -> Statement | None:
    if not plan.config.notify or not shards:
        return None
    return "notify_shards", {
        "shards": sorted(shards),
        "channel": notify_channel(plan.config.schema),
        "notified_xact": notified[0],
        "notified_shards": notified[1],
    }


def take_notified(plan: Plan, result_rows: Sequence[Any]) -> None:
    for shard, xact, notified in result_rows:
        plan.xact = xact
        if notified:
            plan.notified.add(shard)
