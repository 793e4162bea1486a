"""``outboxkit inbox run`` stopped (SIGTERM) while PostgreSQL does not answer: its processes are
frozen, so TCP connections are accepted and nothing is answered on them, as behind a network
partition that sends no reset.

The handler has returned and the middleware's next statement waits for the server when the
SIGTERM comes. It gets the stop's grace (``outboxkit.db.STATEMENT_GRACE_SECONDS``); the server
then does not answer a new connection either, so its connection is closed and no new one is
opened: the process ends with status 0 and without a
traceback. Before, it waited for as long as the server stayed frozen (both clients). Once the
server answers again, the next start applies the event: its effect once.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from outboxkit.devstack import DevStack
from tests.fault.inbox_workers import Worker
from tests.integration.inbox_support import effects, inbox_state, produce_event
from tests.support.waiting import wait_for

pytestmark = pytest.mark.fault

TopicFactory = Callable[..., str]
# Seconds: the 5 s grace and the 2 s question to the server (measured 7.2-7.4 s), then
# (confluent-kafka) up to 5 s for the lease thread, which may be opening a connection.
STOPPED_WITHIN = 20.0
CONSUMER = "billing"  # the name tests/fault/conftest.py's workers run under


def test_sigterm_while_postgres_does_not_answer_ends_the_consumer(
    spawn: Callable[..., Worker],
    outboxkit_stack: DevStack,
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    adapter: str,
    tmp_path: Path,
) -> None:
    if outboxkit_stack.postgres is None:
        pytest.skip("external PostgreSQL: cannot freeze it")
    topic, event = outboxkit_topic(), str(uuid.uuid4())
    release = tmp_path / "release"
    produce_event(outboxkit_kafka_bootstrap, topic, event, "paused-1", 1)
    options = {
        "group": f"g-{uuid.uuid4().hex[:8]}",
        "extra_env": {"APP_RELEASE_FILE": str(release)},
    }
    worker = spawn(topic, **options)
    # Its handler past its own statement (waiting for the release), not only claimed: frozen
    # before that statement answered, the handler would wait for the server, never returning.
    wait_for(lambda: Path(f"{release}.waiting").exists(), what="its handler waiting")
    outboxkit_stack.postgres.freeze()
    try:
        release.touch()  # the handler returns; the batch's mark then waits for the server
        wait_for(lambda: Path(f"{release}.returned").exists(), what="the handler returning")
        began = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        code = worker.wait_exit(timeout=120)
        took = time.monotonic() - began
    finally:
        outboxkit_stack.postgres.thaw()
    log = worker.output(tail=1_000_000)
    assert code == 0, log
    assert took < STOPPED_WITHIN, f"{took:.1f} s\n{log}"
    assert "Traceback" not in log, log
    assert "still waiting for PostgreSQL" in log, log
    # The transaction was rolled back; the next start delivers the event again and applies it.
    assert inbox_state(outboxkit_db_url, event, CONSUMER) == "processing"
    again = spawn(topic, **options)
    wait_for(
        lambda: inbox_state(outboxkit_db_url, event, CONSUMER) == "succeeded",
        what="the event applied",
    )
    assert len(effects(outboxkit_db_url, event)) == 1, again.output()
