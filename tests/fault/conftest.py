"""Fixtures that start ``outboxkit inbox run`` processes (see ``inbox_workers.py``)."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from tests.fault.inbox_workers import OUTBOXKIT, ROOT, Worker, fast_session
from tests.integration.inbox_support import EFFECT_DDL
from tests.support.blocking import env_without
from tests.support.env import service_env


@pytest.fixture(
    params=[
        pytest.param("confluent", id="sync+confluent"),
        pytest.param("aiokafka", id="async+aiokafka"),
    ]
)
def adapter(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def spawner(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    tmp_path: Path,
) -> Iterator[Callable[..., Worker]]:
    with psycopg.connect(outboxkit_db_url) as conn:
        conn.execute(EFFECT_DDL)
    workers: list[Worker] = []

    def start(
        topic: str,
        *,
        group: str,
        fault: str | None = None,
        extra_env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        driver: str,
        client: str | None,
        without: str | None = None,
        verbose: int = 0,
    ) -> Worker:
        """``driver`` picks the handlers (sync or async); ``client`` the --adapter, if any;
        ``verbose`` adds ``-v`` (INFO) or ``-vv`` (DEBUG: every Kafka request, say)."""
        env = service_env(
            outboxkit_db_url,
            outboxkit_kafka_bootstrap,
            OUTBOXKIT_CONSUMER_NAME="billing",
            OUTBOXKIT_CONSUMER_GROUP=group,
            OUTBOXKIT_CONSUMER_TOPICS=topic,
            OUTBOXKIT_CONSUMER_DEAD_LETTER_CHECK="warn",
            PYTHONPATH=str(ROOT),
            **(extra_env or {}),
        )
        if fault:
            env["OUTBOXKIT_FAULT"] = fault
        if without is not None:
            env = env_without(without, base=env)
        registry = "SYNC" if driver == "confluent" else "ASYNC"
        log = tmp_path / f"worker-{len(workers)}.log"
        command = [
            OUTBOXKIT,
            *(("-" + "v" * verbose,) if verbose else ()),
            "inbox",
            "run",
            "--registry",
            f"tests.fault.consumer_app:{registry}",
            *(("--adapter", client) if client else ()),
            *fast_session(driver),
            *args,
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=out)
        worker = Worker(proc, log)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


@pytest.fixture
def spawn(adapter: str, spawner: Callable[..., Worker]) -> Callable[..., Worker]:
    return functools.partial(spawner, driver=adapter, client=adapter)
