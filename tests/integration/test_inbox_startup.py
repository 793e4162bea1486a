"""``outboxkit inbox run`` started before its database exists waits (and says for what), then
goes on once the database is there; it neither crash-loops nor needs a restart."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from outboxkit.devstack.postgres import database_url_with
from tests.support.env import service_env
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def later_database(outboxkit_database_url: str) -> Iterator[tuple[str, str]]:
    """A database name that does not exist yet (dropped afterwards if the test created it)."""
    name = f"outboxkit_late_{uuid.uuid4().hex[:10]}"
    yield name, database_url_with(outboxkit_database_url, name)
    with psycopg.connect(outboxkit_database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def test_run_waits_for_a_database_that_is_not_there_yet(
    outboxkit_database_url: str,
    outboxkit_template_database: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: Callable[..., str],
    later_database: tuple[str, str],
) -> None:
    name, url = later_database
    topic = outboxkit_topic()
    env = service_env(
        url,
        outboxkit_kafka_bootstrap,
        OUTBOXKIT_CONSUMER_NAME="billing",
        OUTBOXKIT_CONSUMER_GROUP=f"g-{uuid.uuid4().hex[:8]}",
    )
    args = ["inbox", "run", "--topic", topic]
    args += ["--registry", "tests.integration.inbox_support:REGISTRY"]
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "outboxkit"), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).parents[2],
        )
        try:

            def output() -> str:
                log.seek(0)
                return log.read()

            wait_for(
                lambda: "consumer waiting for PostgreSQL" in output(),
                timeout=60,
                what="the consumer says it waits for the database",
            )
            assert process.poll() is None, output()  # waiting, not exited
            with psycopg.connect(outboxkit_database_url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        sql.Identifier(name), sql.Identifier(outboxkit_template_database)
                    )
                )
            # Past the database, the next start-up check is Kafka's: the dead-letter topic is
            # missing (auto-create off), which ends the process with one line naming it.
            assert process.wait(timeout=60) == 1, output()
            assert f"dead-letter topic '{topic}.dlq' does not exist" in output()
            assert "Traceback" not in output()
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
