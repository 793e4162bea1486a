"""add_many's COPY path, without I/O: when to take it and what it sends.

Large batches are copied straight into the outbox table instead of bound as arrays to an
``INSERT .. ON CONFLICT``: psycopg formats COPY rows in C and the server skips the speculative
insertion. A COPY cannot compute the shard or skip taken keys, so the shard is computed here by
the exact twin of the SQL function ``outbox_shard`` (the count read in the same transaction), and
a taken key or event id fails the COPY: the writer rolls back to its savepoint and inserts the
same rows with ``ON CONFLICT`` instead, so duplicates and conflicts come out as on that path.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import Any

from outboxkit.outbox_plan import Plan, Statement
from outboxkit.schema import notify_channel


def shard_of(message_key: str | None, event_id: uuid.UUID, shard_count: int) -> int:
    """``outbox_shard`` in Python: the first 32 bits of md5(key, else the event id as text),
    as a signed integer, masked to 31 bits, modulo the count (UTF-8 text, as the server's)."""
    text = message_key if message_key is not None else str(event_id)
    first32 = int.from_bytes(hashlib.md5(text.encode()).digest()[:4], "big")
    return (first32 & 0x7FFFFFFF) % shard_count


def worth_copying(plan: Plan) -> bool:
    """The COPY path pays two more short statements; it costs less from about 100 rows on."""
    minimum = plan.config.copy_min_rows
    return minimum is not None and len(plan.pending()) >= minimum


def copy_input(plan: Plan, shard_count: int) -> tuple[list[tuple[Any, ...]], set[int]]:
    """The COPY's rows (the Row fields, then the shard) and the shards they fall in."""
    out, shards = [], set()
    for i in plan.pending():
        row = plan.rows[i]
        shard = shard_of(row.message_key, row.event_id, shard_count)
        shards.add(shard)
        out.append((*row, shard))
    return out, shards


def ids_statement(plan: Plan) -> Statement:
    return "copied_ids", {"event_ids": [plan.rows[i].event_id for i in plan.pending()]}


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


def take_copied(plan: Plan, result_rows: Sequence[Any]) -> None:
    """Record the copied rows' ids, in input order (every row was written, or the COPY
    failed)."""
    event_ids = [plan.rows[i].event_id for i in plan.pending()]
    ids = [row_id for (row_id,) in result_rows]
    if len(ids) != len(event_ids) or None in ids:
        raise AssertionError("a copied row was not found again")  # cannot happen: same tx
    plan.take_inserted(list(zip(ids, event_ids, strict=True)))


def take_notified(plan: Plan, result_rows: Sequence[Any]) -> None:
    for shard, xact, notified in result_rows:
        plan.xact = xact
        if notified:
            plan.notified.add(shard)
