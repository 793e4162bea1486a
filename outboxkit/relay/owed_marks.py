"""Rows Kafka took whose mark did not commit (at_least_once): marked before anything more goes.

In ``at_least_once`` mode a mark that fails ends the term, and the next term's claim found the
same rows still ``pending`` and sent them again: once per back-off step for as long as marks
failed (a role without UPDATE, a ``statement_timeout`` shorter than the mark, a full disk), i.e.
the same rows again and again while nothing moved on. The rows whose mark is owed are kept here
instead (a batch's until its mark commits, and those of the batch that went out while the
previous mark failed), and the next term marks them before it claims: while marks keep failing,
nothing is sent again; once one works, those rows are published without another send.

Only while this process's terms follow one another: a term whose lease shows another holder
since the last term of this process's (:attr:`LeaseTerm.previous`) drops them, as that holder
claimed them again meanwhile and may have sent some of them again, or only some: marking them
unsent now could leave an older record of a key last on its partition (the per-key order of
at_least_once holds for the last copy). They go with the claims, as before.

They are marked by ``(id, event_id)`` on the shard, as a checkpoint's rows are: after a failover
that lost the database's last writes an id may be reused by a new row, which a mark by id alone
would call published unsent. ``exactly_once`` does not need this: a takeover reconciles the
committed transactions from the checkpoint topic.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any

import psycopg

from outboxkit.kafka.api import Delivery
from outboxkit.relay.lease import LeaseTerm
from outboxkit.relay.reader import OutboxRecord, ShardStore

logger = logging.getLogger("outboxkit.relay.shard_worker")
Conn = psycopg.AsyncConnection[Any]


class OwedMarks:
    """The ``(id, event_id)`` of rows sent whose mark has not committed yet."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._rows: dict[int, str] = {}
        self._term: int | None = None  # the token of the last term that may have owed them

    def __len__(self) -> int:
        return len(self._rows)

    def owe(self, rows: Iterable[tuple[int, str]]) -> None:
        """Before the mark runs: a mark cancelled before its first step owes its rows too."""
        if self.enabled:
            self._rows.update(rows)

    def paid(self, ids: Iterable[int]) -> None:
        if self._rows:
            for row_id in ids:
                self._rows.pop(row_id, None)

    async def awaiting(
        self, mark: Awaitable[None], sent: Sequence[OutboxRecord], deliveries: Sequence[Delivery]
    ) -> None:
        """The previous batch's mark, awaited once ``sent`` went out: if it fails and Kafka took
        every one of them, they are owed too (their own mark would not even start)."""
        try:
            await mark
        except BaseException:
            if len(deliveries) >= len(sent) and all(d.error is None for d in deliveries):
                self.owe((record.id, record.event_id) for record in sent)
            raise

    async def pay(
        self, store: ShardStore, conn: Conn, term: LeaseTerm, *, delete: bool
    ) -> int | None:
        """At each term's start: mark (or delete) the owed rows still pending, under ``term``,
        unless the shard had another holder since; raises as a mark does and then owes them
        still. Returns the rows changed, or None when no mark ran (none owed, or dropped)."""
        last, self._term = self._term, term.token
        if self._rows and term.previous != last:
            logger.info(
                "shard %s: another holder had it since this process sent %d row(s) it could not"
                " mark; they are claimed and sent again",
                term.shard,
                len(self._rows),
            )
            self._rows.clear()
        if not self._rows:
            return None
        rows = list(self._rows.items())
        changed = await store.reconcile(conn, term, rows, delete=delete)
        self.paid(row_id for row_id, _ in rows)
        return changed
