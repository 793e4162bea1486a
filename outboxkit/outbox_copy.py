"""add_many's COPY path, without I/O: when to take it and what it sends.

Large batches are copied straight into the outbox table instead of bound as arrays to an
``INSERT .. ON CONFLICT``: psycopg formats COPY rows in C and the server skips the speculative
insertion. A COPY cannot compute the shard, return ids or skip taken keys. So the shard is
computed here by the exact twin of the SQL function ``outbox_shard`` (the count read in the same
transaction), the ids are taken from the table's identity sequence beforehand, and a taken key or
event id fails the COPY: the writer rolls back to its savepoint and inserts the same rows with
``ON CONFLICT`` instead, so duplicates and conflicts come out as on that path.
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


def setting_statement(plan: Plan) -> Statement:
    return "copy_setting", {"rows": len(plan.pending())}


def copy_input(
    plan: Plan, shard_count: int, ids: Sequence[int]
) -> tuple[list[tuple[Any, ...]], set[int]]:
    """The COPY's rows (a reserved id, the Row fields, the shard) and the shards they fall in.
    Ids ascend in input order, as the INSERT path assigns them."""
    out, shards = [], set()
    for row_id, i in zip(sorted(ids), plan.pending(), strict=True):
        row = plan.rows[i]
        shard = shard_of(row.message_key, row.event_id, shard_count)
        shards.add(shard)
        out.append((row_id, *row, shard))
    return out, shards


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


def take_copied(plan: Plan, rows: Sequence[tuple[Any, ...]]) -> None:
    """Record the copied rows (each written with its reserved id, or the COPY failed)."""
    plan.take_inserted([(row[0], row[1]) for row in rows])


def take_notified(plan: Plan, result_rows: Sequence[Any]) -> None:
    for shard, xact, notified in result_rows:
        plan.xact = xact
        if notified:
            plan.notified.add(shard)
