"""The writer: put events in the outbox on the caller's transaction, never committing.

The idempotency key is claimed by the table's UNIQUE constraint inside the caller's transaction
(``INSERT .. ON CONFLICT (idempotency_key) DO NOTHING``). A conflicting key is then compared by
its stored content digest: same content is a duplicate (the existing ``event_id`` is returned,
nothing is written), other content raises :class:`IdempotencyKeyConflictError`. A concurrent
transaction holding the same key makes the insert wait until it commits (then we re-read its row)
or rolls back (then our insert goes through), so there is no race window. ``add_many`` writes in
a savepoint, so a conflict undoes its own rows by rolling back to it: no DELETE is needed.

Everything that can be checked before writing (topic name, size, serialisation) is checked in
Python first (:mod:`outboxkit.outbox_plan`): when validation fails nothing was sent to the
database and the caller's transaction is still usable. This module only runs the plan's
statements, on a sync or an async connection.
"""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, NestedTransaction
from sqlalchemy.ext.asyncio import AsyncConnection

from outboxkit import db
from outboxkit.errors import ConfigurationError, SerializationError
from outboxkit.ids import uuid7_batch
from outboxkit.limits import DEFAULT_MAX_MESSAGE_BYTES
from outboxkit.outbox_conn import AsyncTarget, SyncTarget, connection, connection_async
from outboxkit.outbox_conn import execute as _execute
from outboxkit.outbox_conn import execute_async as _execute_async
from outboxkit.outbox_copy import (
    COPY_LOCK,
    CopiedIds,
    Stream,
    copy_setting,
    notify_statement,
    take_notified,
    worth_copying,
)
from outboxkit.outbox_plan import (
    OutboxConfig,
    Plan,
    Writable,
    WriteResult,
    prepare,
)
from outboxkit.outbox_target import WRITING, check, shared_connection
from outboxkit.tracing import current_trace_headers

logger = logging.getLogger("outboxkit.outbox")

_NOTIFY_INFO_KEY = "outboxkit.notified"

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "AsyncTarget",
    "Outbox",
    "OutboxConfig",
    "SyncTarget",
    "Writable",
    "WriteResult",
]


def _innermost_savepoint(conn: Connection | AsyncConnection) -> NestedTransaction | None:
    sync = conn.sync_connection if isinstance(conn, AsyncConnection) else conn
    return None if sync is None else sync.get_nested_transaction()


def _same_savepoint(
    recorded: weakref.ref[NestedTransaction] | None, nested: NestedTransaction | None
) -> bool:
    if recorded is None:
        return nested is None
    return nested is not None and recorded() is nested


def _notified_get(conn: Connection | AsyncConnection, schema: str) -> tuple[str | None, list[int]]:
    """The shards already notified in this transaction, if their notifications still stand: a
    caller's savepoint rolled back since takes them with it, so they are sent again (PostgreSQL
    delivers identical notifications of one transaction once; a released one costs a repeat)."""
    entry = conn.info.get(_NOTIFY_INFO_KEY, {}).get(schema)
    if entry is None:
        return None, []
    xact, shards, savepoint = entry
    if savepoint is not None:
        alive = savepoint()
        if alive is None or not _standing(alive):
            return None, []
    return xact, sorted(shards)


def _standing(savepoint: NestedTransaction) -> bool:
    """Whether the savepoint and every one it was opened in are still open: rolling an outer one
    back with this one still open (SQLAlchemy warns, and leaves this one marked active) takes
    this one's notifications too. The parent link is SQLAlchemy's own (without it, this one)."""
    current: NestedTransaction | None = savepoint
    while current is not None:
        if not current.is_active:
            return False
        current = getattr(current, "_previous_nested", None)
    return True


def _notified_put(conn: Connection | AsyncConnection, schema: str, plan: Plan) -> None:
    """Remember the shards notified in this transaction, once the rows that notified are kept
    (a rolled-back savepoint of the writer's own takes its notifications with it), with the
    caller's savepoint they were sent in (SQLAlchemy's ``begin_nested``, a Session's too)."""
    xact, shards = plan.xact, plan.notified
    if xact is None or not shards:
        return
    nested = _innermost_savepoint(conn)
    savepoint = None if nested is None else weakref.ref(nested)
    per_schema = conn.info.setdefault(_NOTIFY_INFO_KEY, {})
    old = per_schema.get(schema)
    if old is not None and old[0] == xact and _same_savepoint(old[2], nested):
        shards = shards | old[1]
    per_schema[schema] = (xact, frozenset(shards), savepoint)


class Outbox:
    """Writes messages to the outbox on the caller's transaction (sync and async)."""

    def __init__(self, config: OutboxConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise ConfigurationError("pass either an OutboxConfig or keyword options, not both")
        self.config = config or OutboxConfig(**options)

    # -- preparing -----------------------------------------------------------------------
    def _plan_one(
        self,
        item: Writable,
        idempotency_key: str | None,
        event_id: uuid.UUID | None,
        headers: Mapping[str, str] | None,
        deliver_after: datetime | None,
    ) -> Plan:
        options: dict[str, Any] = {}  # only those given: a call without any takes no copy
        if idempotency_key is not None:
            options["idempotency_key"] = idempotency_key
        if event_id is not None:
            options["event_id"] = event_id
        if headers is not None:
            if not isinstance(headers, Mapping):  # as a Message's headers are refused
                raise SerializationError(
                    f"headers must map str to str, got {type(headers).__name__}"
                )
            options["headers"] = dict(headers)
        if deliver_after is not None:
            options["deliver_after"] = deliver_after
        return Plan(self.config, [prepare(item, self.config, **options)])

    def _plan_many(self, items: Sequence[Writable]) -> Plan:
        trace_headers = current_trace_headers()  # once per call, not once per row
        config = self.config
        new_ids = uuid7_batch(len(items))
        return Plan(
            config,
            [
                prepare(item, config, trace_headers, new_id)
                for item, new_id in zip(items, new_ids, strict=True)
            ],
        )

    # -- sync ----------------------------------------------------------------------------
    def add(
        self,
        target: SyncTarget,
        item: Writable,
        *,
        idempotency_key: str | None = None,
        event_id: uuid.UUID | None = None,
        headers: Mapping[str, str] | None = None,
        deliver_after: datetime | None = None,
    ) -> WriteResult:
        """Add one event in the transaction of ``target`` (a Session or Connection)."""
        plan = self._plan_one(item, idempotency_key, event_id, headers, deliver_after)
        return self._run(target, plan)[0]

    def add_many(self, target: SyncTarget, items: Iterable[Writable]) -> list[WriteResult]:
        """Add many events with one statement (a call over 256 MB: several); results in input
        order. All or nothing: on a conflict no row of this call stays written."""
        items = list(items)
        if worth_copying(self.config, items):
            return self._run_copy(target, items)
        plan = self._plan_many(items)
        if not plan.rows:
            check(target, asynchronous=False)
            return []
        return self._run(target, plan)

    def _run(self, target: SyncTarget, plan: Plan) -> list[WriteResult]:
        conn, key = connection(target)
        if WRITING.setdefault(key, plan) is not plan:  # another write runs there
            raise shared_connection()
        try:
            if plan.needs_savepoint:
                with db.savepoint(conn):
                    results = self._write(conn, plan)
            else:
                results = self._write(conn, plan)
        finally:
            del WRITING[key]
        _notified_put(conn, self.config.schema, plan)
        return results

    def _write(self, conn: Connection, plan: Plan) -> list[WriteResult]:
        schema = self.config.schema
        notified = _notified_get(conn, schema)
        while True:
            plan.take_inserted(_execute(conn, schema, *plan.insert_statement(notified)))
            reread = plan.reread_statement()
            if reread is not None:
                plan.take_reread(_execute(conn, schema, *reread))
            if not plan.needs_retry():
                return plan.outcome()

    def _run_copy(self, target: SyncTarget, items: list[Writable]) -> list[WriteResult]:
        """add_many by COPY, in a savepoint; a taken key or event id (the COPY fails) or a
        database that is not UTF8 takes the INSERT path instead, in the same savepoint."""
        conn, key = connection(target)
        if WRITING.setdefault(key, items) is not items:  # another write runs there
            raise shared_connection()
        try:
            schema = self.config.schema
            notified = _notified_get(conn, schema)
            with db.savepoint(conn):
                plan = self._copy(conn, items, notified)
                if plan is None:
                    plan = self._plan_many(items)
                    self._write(conn, plan)
                results = plan.outcome()
        finally:
            del WRITING[key]
        _notified_put(conn, schema, plan)
        return results

    def _copy(
        self, conn: Connection, items: list[Writable], notified: tuple[str | None, list[int]]
    ) -> Plan | None:
        schema = self.config.schema
        if not db.can_copy(conn):
            return None
        _execute(conn, schema, *COPY_LOCK)
        [(shard_count, encoding, ids, after_id)] = _execute(conn, schema, *copy_setting(items))
        if encoding != "UTF8":
            return None
        stream = Stream(items, self.config, current_trace_headers(), shard_count, ids)
        try:
            if not db.copy_rows(conn, db.query("outbox", stream.query_name, schema), stream):
                return None
        except sa.exc.IntegrityError:  # a taken key or event id: the ON CONFLICT path decides
            db.rollback_to_savepoint(conn)
            return None
        plan = stream.plan()
        read_back = CopiedIds(plan, after_id)  # only if the identity numbered the rows
        while (statement := read_back.statement()) is not None:
            read_back.take(_execute(conn, schema, *statement))
        statement = notify_statement(plan, stream.shards, notified)
        if statement is not None:
            take_notified(plan, _execute(conn, schema, *statement))
        return plan

    # -- async ---------------------------------------------------------------------------
    async def add_async(
        self,
        target: AsyncTarget,
        item: Writable,
        *,
        idempotency_key: str | None = None,
        event_id: uuid.UUID | None = None,
        headers: Mapping[str, str] | None = None,
        deliver_after: datetime | None = None,
    ) -> WriteResult:
        """:meth:`add` for an AsyncSession or AsyncConnection."""
        plan = self._plan_one(item, idempotency_key, event_id, headers, deliver_after)
        return (await self._run_async(target, plan))[0]

    async def add_many_async(
        self, target: AsyncTarget, items: Iterable[Writable]
    ) -> list[WriteResult]:
        """:meth:`add_many` for an AsyncSession or AsyncConnection."""
        items = list(items)
        if worth_copying(self.config, items):
            return await self._run_copy_async(target, items)
        plan = self._plan_many(items)
        if not plan.rows:
            check(target, asynchronous=True)
            return []
        return await self._run_async(target, plan)

    async def _run_async(self, target: AsyncTarget, plan: Plan) -> list[WriteResult]:
        conn, key = await connection_async(target)
        if WRITING.setdefault(key, plan) is not plan:  # another write runs there
            raise shared_connection()
        try:
            if plan.needs_savepoint:
                async with db.savepoint_async(conn):
                    results = await self._write_async(conn, plan)
            else:
                results = await self._write_async(conn, plan)
        finally:
            del WRITING[key]
        _notified_put(conn, self.config.schema, plan)
        return results

    async def _write_async(self, conn: AsyncConnection, plan: Plan) -> list[WriteResult]:
        schema = self.config.schema
        notified = _notified_get(conn, schema)
        while True:
            rows = await _execute_async(conn, schema, *plan.insert_statement(notified))
            plan.take_inserted(rows)
            reread = plan.reread_statement()
            if reread is not None:
                plan.take_reread(await _execute_async(conn, schema, *reread))
            if not plan.needs_retry():
                return plan.outcome()

    async def _run_copy_async(
        self, target: AsyncTarget, items: list[Writable]
    ) -> list[WriteResult]:
        conn, key = await connection_async(target)
        if WRITING.setdefault(key, items) is not items:  # another write runs there
            raise shared_connection()
        try:
            schema = self.config.schema
            notified = _notified_get(conn, schema)
            async with db.savepoint_async(conn):
                plan = await self._copy_async(conn, items, notified)
                if plan is None:
                    plan = self._plan_many(items)
                    await self._write_async(conn, plan)
                results = plan.outcome()
        finally:
            del WRITING[key]
        _notified_put(conn, schema, plan)
        return results

    async def _copy_async(
        self, conn: AsyncConnection, items: list[Writable], notified: tuple[str | None, list[int]]
    ) -> Plan | None:
        schema = self.config.schema
        if not await db.can_copy_async(conn):
            return None
        await _execute_async(conn, schema, *COPY_LOCK)
        [(shard_count, encoding, ids, after_id)] = await _execute_async(
            conn, schema, *copy_setting(items)
        )
        if encoding != "UTF8":
            return None
        stream = Stream(items, self.config, current_trace_headers(), shard_count, ids)
        query = db.query("outbox", stream.query_name, schema)
        try:
            if not await db.copy_rows_async(conn, query, stream):
                return None
        except sa.exc.IntegrityError:
            await db.rollback_to_savepoint_async(conn)
            return None
        plan = stream.plan()
        read_back = CopiedIds(plan, after_id)  # only if the identity numbered the rows
        while (statement := read_back.statement()) is not None:
            read_back.take(await _execute_async(conn, schema, *statement))
        statement = notify_statement(plan, stream.shards, notified)
        if statement is not None:
            take_notified(plan, await _execute_async(conn, schema, *statement))
        return plan
