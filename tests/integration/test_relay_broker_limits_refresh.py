"""A topic's ``max.message.bytes`` lowered while the relay runs (``at_least_once``): once its
configuration is read again (``REFRESH_AFTER``, driven here by the relay's clock), the relay
cuts its sends and parks as for a topic that had the low limit from the start. Before, the
limit read at the producer's start held for its whole life: the rows behind a refused record
were sent with it and overtook it for good."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import psycopg
import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from outboxkit.relay.broker_limits import READ_BUDGET, REFRESH_AFTER, REFRESH_SPREAD, RETRY_AFTER
from tests.integration.test_relay_broker_limits import TOPIC_LIMIT, _settings
from tests.relay_support import (
    KAFKA_CLIENTS,
    cli_ok,
    consume,
    insert_rows,
    payloads,
    running_relay,
    set_shard_count,
    states_by_key,
)
from tests.support.waiting import wait_for_async

pytestmark = pytest.mark.integration

TopicFactory = Callable[..., str]


def _lower(admin: AdminClient, topic: str, limit: int) -> None:
    """Set the topic's max.message.bytes, as an operator would while the relay runs."""
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def _limit(admin: AdminClient, topic: str) -> str:
    [future] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    return str(future.result(timeout=30)["max.message.bytes"].value)


@pytest.mark.parametrize("client", KAFKA_CLIENTS)
async def test_a_limit_lowered_while_the_relay_runs_cuts_its_sends_after_the_refresh(
    outboxkit_db_url: str,
    outboxkit_kafka_bootstrap: str,
    outboxkit_topic: TopicFactory,
    client: str,
) -> None:
    set_shard_count(outboxkit_db_url, 1)
    topic = outboxkit_topic()  # the broker's default limit: nothing is cut
    insert_rows(outboxkit_db_url, topic, payloads("k", 1))
    admin = AdminClient({"bootstrap.servers": outboxkit_kafka_bootstrap})
    settings = _settings(outboxkit_db_url, outboxkit_kafka_bootstrap, client)
    async with running_relay(settings) as relay:
        clock = [time.monotonic()]
        limits = relay.workers[0]._publisher._gate.limits
        limits._clock = lambda: clock[0]
        limits.reread_budget = READ_BUDGET  # a busy test machine's read is not cut short
        await wait_for_async(
            lambda: states_by_key(outboxkit_db_url) == {"k": ["published"]},
            what="the first row published (the topic's configuration read)",
        )
        await asyncio.to_thread(_lower, admin, topic, TOPIC_LIMIT)
        await wait_for_async(
            lambda: _limit(admin, topic) == str(TOPIC_LIMIT), what="the lowered limit in force"
        )
        # Every read so far is due again, however its interval was spread.
        clock[0] = time.monotonic() + REFRESH_AFTER * (1 + REFRESH_SPREAD)
        large = ("k", json.dumps({"k": "k", "n": 2, "pad": "x" * 300_000}).encode())
        rows = [*payloads("k", 1, start=1), large, *payloads("k", 2, start=3)]
        with psycopg.connect(outboxkit_db_url) as conn:  # one transaction: one claim
            insert_rows(conn, topic, [*rows, *payloads("other", 2)])

        def settled() -> bool:
            # A read again that failed (a busy machine) is tried again after RETRY_AFTER: on
            # the frozen clock it never was, and this waited for its whole timeout.
            clock[0] += RETRY_AFTER
            return states_by_key(outboxkit_db_url) == {
                "k": ["published", "published", "parked", "held", "held"],
                "other": ["published", "published"],
            }

        await wait_for_async(
            settled, what="the large row parked, its key waiting behind it, the other key published"
        )
    [parked] = json.loads(cli_ok(outboxkit_db_url, "outbox", "parked", "--json"))
    assert "toolarge" in parked["reason"].lower().replace("_", ""), parked["reason"]
    got = consume(outboxkit_kafka_bootstrap, topic, expect=4)
    # Each row before the parked one once; nothing of "k" after it.
    assert [r.value for r in got if r.key == "k"] == [v for _, v in payloads("k", 2)]
    assert [r.value for r in got if r.key == "other"] == [v for _, v in payloads("other", 2)]
