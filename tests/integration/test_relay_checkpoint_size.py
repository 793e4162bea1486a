"""A checkpoint larger than the checkpoint topic's ``max.message.bytes`` (it lists every row of
its transaction, ~50 bytes a row): the shard's transactions shrink until their checkpoint fits,
said once; nothing lost, exactly once, per-key order kept. A checkpoint that cannot fit even for
one row is said as such and retried with back-off, not in a hot loop."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator

import pytest

from outboxkit.relay.checkpoint import CHECKPOINT_TOPIC_CONFIG
from tests.relay_support import (
    KAFKA_CLIENTS,
    assert_exactly_once_in_order,
    consume,
    insert_rows,
    payloads,
    relay_settings,
    row_states,
    running_relay,
    set_shard_count,
)
from tests.support.log_records import Lines
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]

SHRINKING = "halved again until its checkpoint fits"
ONE_ROW = "even a one-row checkpoint"


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("outboxkit.relay")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.DEBUG
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _checkpoint_topic(factory: TopicFactory, max_bytes: int) -> str:
    config = {**CHECKPOINT_TOPIC_CONFIG, "max.message.bytes": str(max_bytes)}
    return factory("cp", partitions=1, config=config)


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_checkpoint_too_large_for_its_topic_shrinks_the_transactions(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    lines: Lines,
    client: str,
) -> None:
    """A backlog of 3,000 rows in transactions of up to 2,000 (a ~100 KB checkpoint) and a
    20 KB limit: before, every transaction was refused and rebuilt alike, for ever."""
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic(partitions=2)
    expected = [row for key in ("a", "b", "c") for row in payloads(key, 1000)]
    insert_rows(outboxkit_db_url, topic, expected)
    settings = relay_settings(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        client=client,
        checkpoint_topic=_checkpoint_topic(outboxkit_topic, 20_000),
        batch_size=100,
        max_batch_size=500,
        transaction_max_rows=2000,
        transaction_max_ms=60_000,
    )
    async with running_relay(settings):
        await wait_for_async(
            lambda: row_states(outboxkit_db_url) == {"published": len(expected)},
            within=120,
            what="every row published",
        )
    assert_exactly_once_in_order(
        consume(outboxkit_kafka_bootstrap, topic, expect=len(expected)), expected
    )
    told = [r for r in lines.records if SHRINKING in r.getMessage()]
    warned = [r.getMessage() for r in told if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned  # said once, however often the transactions are halved
    assert (
        f"max.message.bytes of the checkpoint topic {settings.relay.checkpoint_topic}"
        in (warned[0])
    )
    assert not [m for m in lines.messages if "publishing failed" in m]


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_checkpoint_that_cannot_fit_even_for_one_row_is_an_error_with_back_off(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    lines: Lines,
    client: str,
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()
    insert_rows(outboxkit_db_url, topic, payloads("a", 20))
    settings = relay_settings(
        outboxkit_db_url,
        outboxkit_kafka_bootstrap,
        client=client,
        checkpoint_topic=_checkpoint_topic(outboxkit_topic, 100),
        batch_size=20,
        backoff_initial=1.0,
        backoff_max=1.0,
    )

    def refusals() -> list[logging.LogRecord]:
        return [r for r in lines.records if ONE_ROW in r.getMessage()]

    async with running_relay(settings):
        await wait_for_async(lambda: len(refusals()) >= 3, within=60, what="three refusals")
    failures = refusals()
    assert row_states(outboxkit_db_url) == {"pending": 20}
    # Retried after the back-off (full jitter in [0.5, 1] s), not at once.
    times = [r.created for r in failures]
    assert all(later - earlier >= 0.4 for earlier, later in itertools.pairwise(times)), times
    assert "max.message.bytes of the checkpoint topic" in failures[0].getMessage()
