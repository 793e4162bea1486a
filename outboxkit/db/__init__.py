"""The one database seam (internal, not a public API): every statement outboxkit runs goes here.

``queries`` loads the named statements of ``db/sql/*.sql``; ``execute`` runs them on a caller's
connection (sync or async) or ours; ``connect`` opens our own; ``migrator`` applies the schema.
Usage: ``db.one(conn, db.query("relay", "shard_count", schema))``.
"""

from __future__ import annotations

from outboxkit.db import migrator
from outboxkit.db.abandon import (
    CONNECT_TIMEOUT_SECONDS,
    STATEMENT_GRACE_SECONDS,
    OpenConnections,
    StopWatchdog,
    answers,
    connect_timeout,
)
from outboxkit.db.connect import (
    Url,
    checked_url,
    connect,
    connect_async,
    connection_async,
    redact,
    url_problem,
)
from outboxkit.db.copy import can_copy, can_copy_async, copy_rows, copy_rows_async
from outboxkit.db.engines import sqlalchemy_url
from outboxkit.db.execute import (
    AsyncTarget,
    Result,
    SyncTarget,
    execute,
    execute_async,
    not_utf8,
    one,
    one_async,
    rows,
    rows_async,
    run,
    run_async,
    untranslatable,
)
from outboxkit.db.listen import listen, listen_async
from outboxkit.db.queries import Query, queries, query
from outboxkit.db.savepoint import (
    rollback_to_savepoint,
    rollback_to_savepoint_async,
    savepoint,
    savepoint_async,
)
from outboxkit.db.start_options import prompt_free

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "STATEMENT_GRACE_SECONDS",
    "AsyncTarget",
    "OpenConnections",
    "Query",
    "Result",
    "StopWatchdog",
    "SyncTarget",
    "Url",
    "answers",
    "can_copy",
    "can_copy_async",
    "checked_url",
    "connect",
    "connect_async",
    "connect_timeout",
    "connection_async",
    "copy_rows",
    "copy_rows_async",
    "execute",
    "execute_async",
    "listen",
    "listen_async",
    "migrator",
    "not_utf8",
    "one",
    "one_async",
    "prompt_free",
    "queries",
    "query",
    "redact",
    "rollback_to_savepoint",
    "rollback_to_savepoint_async",
    "rows",
    "rows_async",
    "run",
    "run_async",
    "savepoint",
    "savepoint_async",
    "sqlalchemy_url",
    "untranslatable",
    "url_problem",
]
