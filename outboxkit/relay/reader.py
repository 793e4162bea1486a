"""Commit-safe reading of one shard, and the relay's token-conditional writes.

Rows are selected by *state*, never by an ``id > last_seen`` cursor: a row whose transaction is
still open is invisible now and is found by a later claim once it commits, so nothing committed
is skipped, whatever order transactions commit in.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from outboxkit import db, wire
from outboxkit.db.id_arrays import BigintIds
from outboxkit.kafka.api import ProduceRequest
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.lease_loss import token_check_failed
from outboxkit.schema import parked_lock_name

Conn = psycopg.AsyncConnection[Any]


class OutboxRecord(NamedTuple):
    """One claimed row. A named tuple, not a dataclass: a batch builds hundreds of these."""

    id: int
    event_id: str  # text: the claim casts it (see relay.sql)
    idempotency_key: str
    topic: str
    key: str | None
    payload: bytes
    content_type: str
    headers: dict[str, str] | None  # None: no headers of its own (the usual row)
    event_type: str | None
    schema_version: int | None
    aggregate_type: str | None
    aggregate_id: str | None
    attempts: int

    def kafka_headers(self) -> list[tuple[str, bytes]]:
        """Row columns as Kafka headers; the row's own headers (e.g. traceparent) come first."""
        if self.headers:
            return self._merged_headers()
        # No headers of its own (the usual row): the same list, without the dict round trip.
        out = [
            (wire.HEADER_EVENT_ID, self.event_id.encode()),
            (wire.HEADER_IDEMPOTENCY_KEY, self.idempotency_key.encode()),
            (wire.HEADER_CONTENT_TYPE, self.content_type.encode()),
        ]
        if self.event_type is not None:
            out.append((wire.HEADER_EVENT_TYPE, self.event_type.encode()))
        if self.schema_version is not None:
            out.append((wire.HEADER_SCHEMA_VERSION, str(self.schema_version).encode()))
        if self.aggregate_type is not None:
            out.append((wire.HEADER_AGGREGATE_TYPE, self.aggregate_type.encode()))
        if self.aggregate_id is not None:
            out.append((wire.HEADER_AGGREGATE_ID, self.aggregate_id.encode()))
        return out

    def _merged_headers(self) -> list[tuple[str, bytes]]:
        out: dict[str, str] = dict(self.headers or {})
        out[wire.HEADER_EVENT_ID] = self.event_id
        out[wire.HEADER_IDEMPOTENCY_KEY] = self.idempotency_key
        out[wire.HEADER_CONTENT_TYPE] = self.content_type
        for name, value in (
            (wire.HEADER_EVENT_TYPE, self.event_type),
            (wire.HEADER_SCHEMA_VERSION, self.schema_version),
            (wire.HEADER_AGGREGATE_TYPE, self.aggregate_type),
            (wire.HEADER_AGGREGATE_ID, self.aggregate_id),
        ):
            if value is not None:
                out[name] = str(value)
        return wire.dict_to_headers(out)


_make = OutboxRecord._make
_FIELDS = len(OutboxRecord._fields)  # the claim's columns; one more: the running byte count


def produce_requests(records: Sequence[OutboxRecord]) -> list[ProduceRequest]:
    """The Kafka records of claimed rows, in order.

    The hot path of every drain: the usual row (no headers of its own, none of the optional
    columns) gets its three headers built inline, and each record is made with ``tuple.__new__``
    (a named tuple's own ``__new__`` is a Python call with defaults). Same headers, same bytes as
    :meth:`OutboxRecord.kafka_headers`, which every other row goes through.
    """
    new, request = tuple.__new__, ProduceRequest
    event_id, idempotency_key, content_type = _FIXED_HEADERS
    return [
        new(
            request,
            (
                r[3],  # topic
                r[4].encode() if r[4] is not None else None,  # key
                r[5],  # payload
                [
                    (event_id, r[1].encode()),
                    (idempotency_key, r[2].encode()),
                    (content_type, r[6].encode()),
                ]
                # headers, event_type, schema_version, aggregate_type, aggregate_id: all NULL
                if r[7:12] == _PLAIN
                else r.kafka_headers(),
                None,  # partition: the partitioner picks
            ),
        )
        for r in records
    ]


_FIXED_HEADERS = (wire.HEADER_EVENT_ID, wire.HEADER_IDEMPOTENCY_KEY, wire.HEADER_CONTENT_TYPE)
_PLAIN = (None, None, None, None, None)


def _record(row: Sequence[Any], defects: dict[int, str]) -> OutboxRecord:
    # The claim returns NULL for the usual empty headers object, so most rows skip JSON and
    # become a record as they are (one tuple copy, no field-by-field work).
    headers = row[7]
    if headers is None and type(row[5]) is bytes:
        return _make(row[:_FIELDS])
    headers = {} if headers is None else _headers(row[0], headers, defects)
    payload = row[5]
    return OutboxRecord(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        payload if type(payload) is bytes else bytes(payload),
        row[6],
        headers,
        row[8],
        row[9],
        row[10],
        row[11],
        row[12],
    )


def _headers(row_id: int, text: str, defects: dict[int, str]) -> dict[str, str]:
    """The row's own headers, from their JSON text (the claim casts them: psycopg would decode
    jsonb while fetching, where one undecodable row failed every claim of its shard). The writer
    stores a JSON object of strings; a row written by other means may hold anything jsonb can
    (an array, a number, nesting deeper than Python's json decodes): such a row is recorded in
    ``defects`` with the reason, to be parked. Values that are not strings go out as their text,
    as they always did."""
    try:
        value = json.loads(text)
        if isinstance(value, str):  # a JSON string: double-encoded headers were always accepted
            with contextlib.suppress(ValueError, RecursionError):
                value = json.loads(value)
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        if value is None:  # a JSON null: no headers, as psycopg's jsonb None always meant
            return {}
    except RecursionError:
        defects[row_id] = (
            "headers must be a JSON object of strings; these are nested too deeply to decode"
        )
        return {}
    except ValueError as exc:  # not expected of PostgreSQL's jsonb text; a defect all the same
        defects[row_id] = f"headers are not readable JSON: {exc}"
        return {}
    defects[row_id] = f"headers must be a JSON object, not a JSON {_json_kind(value)}"
    return {}


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    return "boolean" if isinstance(value, bool) else "number"


#: How many pending rows, from the front of the claim's walk, a hold pass reads for rows behind a
#: parked row of their key (hold_rows): what the next claims would read.
HOLD_WINDOW = 10_000


class Moves(NamedTuple):
    """Rows one statement pair of the scheduling pass moved, each way (schedule_rows, hold_rows)."""

    later: int  # to 'scheduled'
    due: int  # back from 'scheduled'
    held: int  # to 'held', behind a parked row of their key
    released: int  # back from 'held', no parked row of their key left
    walking: bool = False  # held keys left to walk (held_keys_walk) before the walk starts again
    letting_go: bool = False  # so, under policy 'skip': all come back before the next claim


class ShardStore:
    """Claim and fenced writes of one shard, on an autocommit connection."""

    def __init__(
        self, schema: str, *, skip_parked_keys: bool = False, max_bytes: int = 16 * 1024 * 1024
    ) -> None:
        self._schema = schema
        self._skip_parked_keys = skip_parked_keys
        self._parked_lock = parked_lock_name(schema)
        self._max_bytes = max_bytes
        # (token, key): the walk of held keys goes on after key in that term (a new term starts
        # over: another holder may have held keys behind it); None: from the first.
        self._held_after: tuple[int, str] | None = None
        # Claimed rows that cannot become a Kafka record (row id -> why): the topic gate parks
        # them with the reason before anything is sent.
        self.defects: dict[int, str] = {}
        self.claimed_bytes = 0  # of the last claim (see claim)

    def _query(self, name: str) -> db.Query:
        return db.query("relay", name, self._schema)

    async def claim(
        self,
        conn: Conn,
        shard: int,
        limit: int,
        in_flight: Sequence[int] = (),
        *,
        now: datetime | None = None,
    ) -> list[OutboxRecord]:
        """Pending rows in id order, from the lowest, without ``in_flight`` (see SQL). ``now``
        (tests only) replaces the database clock in deciding which rows are due."""
        found = await db.run_async(
            conn,
            self._query("claim_batch"),
            {
                "shard": shard,
                "limit": limit,
                "max_bytes": self._max_bytes,
                "skip_parked_keys": self._skip_parked_keys,
                "in_flight": BigintIds(in_flight),
                "now": now,
            },
            binary=True,  # id arrays: packed whole (db.id_arrays), no per-element dumping
        )
        defects = self.defects
        if defects:  # a row claimed again is judged again (it may have been fixed meanwhile)
            for row in found.rows:
                defects.pop(row[0], None)
        # Bytes the claim counted against max_bytes (payload, key, headers): the last row's sum.
        self.claimed_bytes = int(found.rows[-1][_FIELDS]) if found.rows else 0
        return [_record(row, defects) for row in found.rows]

    async def _fenced(
        self, conn: Conn, name: str, term: LeaseTerm, *, now: datetime | None, **params: Any
    ) -> int:
        """Run a token-conditional write; ``now`` (tests only) replaces the database clock in
        its lease check (and in its own time window, if it has one)."""
        return (await self._fenced_counts(conn, name, term, now=now, **params))[0]

    async def _fenced_counts(
        self, conn: Conn, name: str, term: LeaseTerm, *, now: datetime | None, **params: Any
    ) -> list[int]:
        """:meth:`_fenced` of a statement that counts more than one kind of change."""
        found = await db.run_async(
            conn, self._query(name), {**term.sql_params(now), **params}, binary=True
        )
        assert found.rows
        held, *changed = (int(value) for value in found.rows[0])
        if not held:
            await token_check_failed(conn, self._schema, term, name, now=now)
        return changed

    async def raise_producer_slots(self, conn: Conn, term: LeaseTerm, slots: int) -> int:
        """The slots a takeover must fence: the shard's recorded count raised to ``slots``."""
        return await self._fenced(conn, "producer_slots_raise", term, now=None, slots=slots)

    async def record_producer_slots(self, conn: Conn, term: LeaseTerm, slots: int) -> None:
        """The slots above ``slots`` were fenced: only this term's own may be in use."""
        await self._fenced(conn, "producer_slots_fenced", term, now=None, slots=slots)

    async def mark_published(
        self,
        conn: Conn,
        term: LeaseTerm,
        ids: Sequence[int],
        *,
        delete: bool,
        now: datetime | None = None,
    ) -> int:
        name = "delete_published" if delete else "mark_published"
        return await self._fenced(conn, name, term, now=now, ids=BigintIds(ids))

    async def reconcile(
        self,
        conn: Conn,
        term: LeaseTerm,
        carried: Sequence[tuple[int, str]],
        *,
        delete: bool,
        now: datetime | None = None,
    ) -> int:
        """Mark (or delete) the rows a committed Kafka transaction carried."""
        name = "reconcile_deleted" if delete else "reconcile_published"
        return await self._fenced(
            conn,
            name,
            term,
            now=now,
            ids=BigintIds([row_id for row_id, _ in carried]),
            event_ids=[event_id for _, event_id in carried],
        )

    async def park(
        self, conn: Conn, term: LeaseTerm, row_id: int, reason: str, *, now: datetime | None = None
    ) -> int:
        return await self._fenced(conn, "park", term, now=now, id=row_id, reason=reason[:2000])

    async def record_failure(
        self,
        conn: Conn,
        term: LeaseTerm,
        ids: Sequence[int],
        error: str,
        *,
        now: datetime | None = None,
    ) -> int:
        return await self._fenced(
            conn, "record_failure", term, now=now, ids=BigintIds(ids), error=error[:2000]
        )

    async def retention(
        self,
        conn: Conn,
        term: LeaseTerm,
        keep_seconds: float,
        limit: int,
        *,
        now: datetime | None = None,
    ) -> int:
        """Delete one batch of published rows older than the window (``now``, tests only: the
        clock of both the window and the lease check)."""
        return await self._fenced(
            conn, "retention_delete", term, keep_seconds=keep_seconds, limit=limit, now=now
        )

    async def schedule(
        self,
        conn: Conn,
        term: LeaseTerm,
        limit: int,
        ahead_seconds: float,
        *,
        now: datetime | None = None,
    ) -> Moves:
        """Move up to ``limit`` rows due more than ``ahead_seconds`` from now to 'scheduled',
        and up to ``limit`` scheduled rows due within that back to 'pending' (``now``, tests
        only: the clock of both and of the lease check); then up to ``limit`` rows behind a
        parked row of their key to 'held', and up to ``limit`` held rows with none left back."""
        # Index walks only, as for status's count: with statistics that do not know the rows
        # yet, the planner sorted the shard's whole pending walk for the first move, and joined
        # the rows to update by reading the whole table (100,000 rows due: 49 s instead of 1).
        lock = {"name": self._parked_lock, "shard": term.shard}
        async with conn.transaction():
            # First, before the lease row's lock (parked_lock in relay.sql says why).
            row = await db.one_async(conn, self._query("parked_try_lock"), lock)
            await db.execute_async(conn, self._query("pending_walk_only"))
            waiting, due = await self._fenced_counts(
                conn, "schedule_rows", term, now=now, limit=limit, ahead_seconds=ahead_seconds
            )
            hold = row is not None and bool(row[0])
            held, released = await self._hold(conn, term, limit, now) if hold else (0, 0)
        walking = hold and self._held_after is not None
        return Moves(waiting, due, held, released, walking, walking and self._skip_parked_keys)

    async def _hold(
        self, conn: Conn, term: LeaseTerm, limit: int, now: datetime | None
    ) -> tuple[int, int]:
        """Rows behind a parked row of their key to 'held'; then a step of the walk of held keys
        (held_keys_walk), whose rows with no parked row left (any under 'skip') come back."""
        skip = {"shard": term.shard, "skip_parked_keys": self._skip_parked_keys}
        held = await self._fenced(
            conn, "hold_rows", term, now=now, limit=limit, window=HOLD_WINDOW, **skip
        )
        token, after = self._held_after or (term.token, None)
        step = {**skip, "after": after if token == term.token else None, "limit": limit}
        walked = await db.rows_async(conn, self._query("held_keys_walk"), step)
        keys, released = [str(r[0]) for r in walked if r[1]], 0
        if keys:  # at most 10 rows a key: when more may be left, the same step again next time
            rows = {"keys": keys, "limit": 10 * limit, **skip}
            released = await self._fenced(conn, "held_orphans_release", term, now=now, **rows)
        if released < 10 * limit:
            self._held_after = (term.token, str(walked[-1][0])) if len(walked) >= limit else None
        return held, released

    async def paused(self, conn: Conn, group: str) -> bool:
        row = await db.one_async(conn, self._query("control_paused"), {"group": group})
        return bool(row and row[0])

    async def shard_count(self, conn: Conn) -> int:
        row = await db.one_async(conn, self._query("shard_count"))
        assert row is not None
        return int(row[0])
