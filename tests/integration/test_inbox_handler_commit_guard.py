"""The handler's connection refuses every commit but ours, whichever way it is asked for: the
session's (refused before), the connection's own ``commit()`` (the connection is closed: the
run goes on one event at a time), and transaction control sent as
SQL (``COMMIT``, ``ROLLBACK``, ``PREPARE TRANSACTION`` ..., through ``execute`` or
``exec_driver_sql``). Savepoints pass. Other connections of the same engine are not touched."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from psycopg import sql as psycopg_sql

from outboxkit.errors import HandlerCommitError
from outboxkit.inbox.handler_session import allow_commit, handler_session

pytestmark = pytest.mark.integration

ENDS = [
    "COMMIT",
    "rollback and chain",
    "/* x */ END",
    "-- a\nABORT",
    "PREPARE TRANSACTION 'x'",
    "SELECT 1; COMMIT",  # without parameters psycopg sends it as one simple query
]
COUNT = sa.text("SELECT count(*) FROM public.guarded")


def test_the_handler_connection_refuses_transaction_control_as_sql(outboxkit_db_url: str) -> None:
    engine = sa.create_engine(outboxkit_db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.begin() as setup:
            setup.exec_driver_sql("CREATE TABLE public.guarded (n int)")
        session, conn = handler_session(engine)
        with conn, session:
            session.execute(sa.text("INSERT INTO public.guarded VALUES (1)"))
            for statement in ENDS:
                with pytest.raises(HandlerCommitError, match="must not end its transaction"):
                    session.execute(sa.text(statement))
                with pytest.raises(HandlerCommitError):
                    conn.exec_driver_sql(statement)
                with pytest.raises(HandlerCommitError):
                    conn.connection.driver_connection.execute(statement)
                with pytest.raises(HandlerCommitError):
                    conn.connection.driver_connection.cursor().executemany(statement, [()])
            with pytest.raises(HandlerCommitError):
                conn.connection.driver_connection.execute(psycopg_sql.SQL("COMMIT"))
            session.execute(sa.text("SELECT 'a; commit' WHERE :n = 1"), {"n": 1})  # parameters
            nested = session.begin_nested()  # SAVEPOINT, ROLLBACK TO SAVEPOINT: allowed
            session.execute(sa.text("INSERT INTO public.guarded VALUES (2)"))
            nested.rollback()
            assert session.execute(COUNT).scalar() == 1
            allow_commit(session)
            session.commit()
        with engine.connect() as other:  # the same pooled connection, back to plain
            assert other.execute(COUNT).scalar() == 1
            other.exec_driver_sql("COMMIT")
            other.commit()
    finally:
        engine.dispose()
