"""Each consumer keeps its inbox rows for its own window: a purge deletes only the rows (dedup
rows and rejections) of the consumer it runs for, unless every consumer's are asked for."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine

from outboxkit.cli import main
from outboxkit.inbox import Inbox, InboxSettings
from outboxkit.inbox.loop import ConsumerLoop
from outboxkit.inbox.loop_options import LoopOptions
from outboxkit.inbox.retention import Retention, purge_finished
from outboxkit.inbox.steps import drive_sync
from tests.integration.inbox_support import REGISTRY, fetch

pytestmark = pytest.mark.integration

DAY = 86400


def _seed(db_url: str, consumers: tuple[str, ...], rows: int = 1) -> None:
    """``rows`` terminal rows and rejections per consumer, finished ten days ago."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        for consumer in consumers:
            for n in range(rows):
                conn.execute(
                    "INSERT INTO outboxkit.inbox_message (consumer, event_id, state, finished_at)"
                    " VALUES (%s, %s, 'succeeded', now() - interval '10 days')",
                    (consumer, f"old-{n}"),
                )
                conn.execute(
                    "INSERT INTO outboxkit.inbox_rejection"
                    " (consumer, reason, topic, kafka_partition, kafka_offset, created_at)"
                    " VALUES (%s, 'old', 't', 0, %s, now() - interval '10 days')",
                    (consumer, n),
                )


def _left(db_url: str) -> dict[str, tuple[int, int]]:
    """consumer -> (dedup rows, rejections) still stored."""
    rows = fetch(
        db_url,
        "SELECT consumer, sum(m), sum(r) FROM ("
        " SELECT consumer, 1 AS m, 0 AS r FROM outboxkit.inbox_message"
        " UNION ALL SELECT consumer, 0, 1 FROM outboxkit.inbox_rejection) AS x"
        " GROUP BY consumer",
    )
    return {consumer: (int(m), int(r)) for consumer, m, r in rows}


@pytest.fixture
def engine(sa_url: str) -> Iterator[Engine]:
    eng = create_engine(sa_url)
    yield eng
    eng.dispose()


def test_a_purge_for_one_consumer_keeps_the_rows_of_the_others(
    outboxkit_db_url: str, engine: Engine
) -> None:
    _seed(outboxkit_db_url, ("billing", "audit"))
    result = purge_finished(engine, consumer="billing", window_seconds=DAY)
    assert (result.messages, result.rejections) == (1, 1)
    assert _left(outboxkit_db_url) == {"audit": (1, 1)}


def test_every_consumer_is_purged_only_when_asked_for(
    outboxkit_db_url: str, engine: Engine
) -> None:
    _seed(outboxkit_db_url, ("billing", "audit"))
    result = purge_finished(engine, consumer=None, window_seconds=DAY)
    assert (result.messages, result.rejections) == (2, 2)
    assert _left(outboxkit_db_url) == {}


def test_the_consumer_loop_purges_only_its_own_rows(outboxkit_db_url: str, engine: Engine) -> None:
    """The loop's timer (``inbox run``, the adapters' ``retention=``) runs for its consumer."""
    _seed(outboxkit_db_url, ("billing", "audit"))
    inbox = Inbox(
        engine, lambda e, c, s: None, InboxSettings(consumer="billing", registry=REGISTRY)
    )
    try:
        options = LoopOptions(topics=["orders"], retention=Retention(DAY))
        loop = ConsumerLoop(inbox.core, options, clock=lambda: 0.0)
        assert drive_sync(loop.purger.run_due(0.0), inbox.executor()) == 2
    finally:
        inbox.close()
    assert _left(outboxkit_db_url) == {"audit": (1, 1)}


def test_max_batches_counts_each_table_so_rejections_are_purged_too(
    outboxkit_db_url: str, engine: Engine
) -> None:
    """A backlog of dedup rows takes its ``max_batches``; the rejection log gets its own."""
    _seed(outboxkit_db_url, ("billing",), rows=3)
    result = purge_finished(
        engine, consumer="billing", window_seconds=DAY, batch_size=1, max_batches=2
    )
    assert (result.messages, result.rejections, result.batches) == (2, 2, 4)
    assert _left(outboxkit_db_url) == {"billing": (1, 1)}


def _purge(db_url: str, *args: str) -> tuple[int, str]:
    command = ["inbox", "purge", "--older-than", str(DAY), *args, "--database-url", db_url]
    result = CliRunner().invoke(main, command)
    return result.exit_code, result.output


def test_inbox_purge_needs_a_consumer_or_all_consumers(outboxkit_db_url: str) -> None:
    _seed(outboxkit_db_url, ("billing", "audit"))
    for refused in ((), ("--consumer", "billing", "--all-consumers")):
        code, out = _purge(outboxkit_db_url, *refused)
        assert code == 2, out
        assert "give either --consumer NAME or --all-consumers" in out
    assert _left(outboxkit_db_url) == {"audit": (1, 1), "billing": (1, 1)}  # nothing ran

    code, out = _purge(outboxkit_db_url, "--consumer", "billing")
    assert (code, out.strip()) == (0, "deleted 1 inbox rows and 1 rejections in 2 batches")
    assert _left(outboxkit_db_url) == {"audit": (1, 1)}
    code, out = _purge(outboxkit_db_url, "--all-consumers")
    assert (code, out.strip()) == (0, "deleted 1 inbox rows and 1 rejections in 2 batches")
    assert _left(outboxkit_db_url) == {}
