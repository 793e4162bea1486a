"""What the server is doing, read from ``pg_stat_activity`` (tests wait on it, not on sleeps)."""

from __future__ import annotations

import psycopg


def statement_running(db_url: str, application_name: str, text: str) -> bool:
    """Whether a session named ``application_name`` is running a statement containing ``text``."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND state = 'active' AND query LIKE %s",
            (application_name, f"%{text}%"),
        ).fetchone()
    return bool(row and row[0])
